#!/bin/bash
# cifar100-lt: rendered by hpc-train 0.1.0 from default.sbatch.j2
# 1 node(s) x 1 rank(s) = 1 rank(s), launcher srun
# BatchNorm: per rank (one rank: its batch is the global batch)
#SBATCH --job-name=cifar100-lt
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --gpus-per-node=1
#SBATCH --mem=0G
#SBATCH --time=12:00:00
#SBATCH --partition=a100
#SBATCH --account=proj-ml
#SBATCH --qos=normal
#SBATCH --constraint=ib
#SBATCH --exclusive
#SBATCH --output=/shared/project/runs/cifar100-lt/.submitit/%A_%a_0_log.out
#SBATCH --error=/shared/project/runs/cifar100-lt/.submitit/%A_%a_0_log.err
#SBATCH --open-mode=append
#SBATCH --signal=USR2@120
#SBATCH --requeue
#SBATCH --array=0-1%2
#SBATCH --hint=nomultithread
#SBATCH --mail-type=END

# Stop at the first failing setup command; the launch itself is checked by hand below.
set -eo pipefail

# --- environment -------------------------------------------------------------------------------
# EL batch shells are non-login shells: /etc/profile.d is not read, so `module` may be missing.
if ! command -v module >/dev/null 2>&1; then
    for modules_init in /usr/share/lmod/lmod/init/bash /etc/profile.d/lmod.sh \
                        /usr/share/Modules/init/bash /etc/profile.d/modules.sh; do
        if [ -r "$modules_init" ]; then
            # shellcheck disable=SC1090
            . "$modules_init"
            break
        fi
    done
fi
module purge
module load cuda/12.4 nccl/2.21
# shellcheck disable=SC1090,SC1091
. /shared/envs/lt/bin/activate
PYTHON=/shared/envs/lt/bin/python
# Slurm >= 22.05: srun no longer inherits --cpus-per-task from sbatch.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-8}"
export OMP_NUM_THREADS=8
# A dead rank ends the job with its name instead of blocking every other rank until the time limit.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_ASYNC_ERROR_HANDLING=1
export PYTHONUNBUFFERED=1
# The ranks' heartbeats follow the watchdog's timeout (hpc_train/rank/heartbeat.py).
export HPC_TRAIN_HANG_TIMEOUT_S=900
export NCCL_IB_HCA=mlx5_0:1
export NCCL_SOCKET_IFNAME='^docker,lo'
# --- packed sweep points: several runs in this allocation, each its own run directory ------------
# --pack 2: array task T runs points T*2 ... of the sweep together on this node (and its
# one GPU). Each point has its own run directory (<array job id>_<point>), job.yaml, logs, checkpoints,
# state and MASTER_PORT; the pack runner (hpc_train.local --pack) starts them, passes the signal on,
# and requeues this task once, after all points have ended, when one checkpointed on it.
task_id="${SLURM_ARRAY_TASK_ID:-0}"
run_dirs=()
points=0
for slot in $(seq 0 $(( 2 - 1 ))); do
    point=$(( 0 + task_id * 2 + slot ))
    if [ "$point" -ge 3 ]; then
        break
    fi
    RUN_DIR=/shared/project/runs/cifar100-lt/"${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}_${point}"
    mkdir -p "$RUN_DIR/logs"
    case "$point" in
        0)
cat > "$RUN_DIR/job.yaml" <<'HPC_TRAIN_JOB_BD32088757C0'
name: cifar100-lt
runs_dir: runs
slurm:
  nodes: 1
  gpus_per_node: 1
  tasks_per_node: null
  cpus_per_task: 8
  mem_gb: 0
  time: '12:00:00'
  partition: a100
  account: proj-ml
  qos: normal
  constraint: ib
  exclusive: true
  launcher: srun
  template: default.sbatch.j2
  modules:
  - cuda/12.4
  - nccl/2.21
  module_purge: true
  venv: /shared/envs/lt
  conda_env: null
  python: null
  env:
    NCCL_SOCKET_IFNAME: ^docker,lo
    NCCL_IB_HCA: mlx5_0:1
  container: null
  signal: USR2
  signal_delay_s: 120
  requeue: true
  max_requeues: 3
  hang_timeout_s: 900
  hang_action: fail
  exclude_bad_nodes: true
  gpu_flag: null
  gres_name: gpu
  cpu_bind: null
  srun_args: []
  extra_sbatch:
    mail-type: END
    hint: nomultithread
  master_port_base: 20000
  master_port_span: 12000
  pack: 2
train:
  device: auto
  strategy: ddp
  seed: 0
  epochs: 30
  batch_size: 64
  eval_batch_size: 256
  sync_bn: auto
  tf32: true
  amp: 'off'
  channels_last: false
  amp_weight_copy: true
  compile: false
  compile_cache_dir: null
  cuda_graphs: auto
  cudnn_benchmark: true
  deterministic: false
  num_threads: null
  eval_every_epochs: 1
  checkpoint_every_epochs: 1
  checkpoint_every_s: null
  keep_checkpoints: 2
  log_every_steps: 20
  preempt_check_every_steps: 10
  process_group_timeout_s: 600
  tensorboard: false
  mixup_alpha: 0.0
  data:
    name: digits-lt
    args: {}
    root: data
    imbalance_factor: 20.0
    profile: exp
    seed: 0
    train_list: null
    val_list: null
    test_list: null
    val_fraction: 0.0
    num_classes: 10
    max_per_class: 500
    test_per_class: 50
    image_size: 32
    random_crop_padding: null
    random_flip: null
    num_workers: 4
    download: false
    stage_to: null
    color_jitter: 0.4
  model:
    name: small_cnn
    args: {}
    classifier: linear
  loss:
    name: balanced_softmax
    args: {}
    label_smoothing: 0.0
    focal_gamma: 1.0
    ldam_max_margin: 0.5
    ldam_scale: 30.0
    tau: 1.0
    reweight: none
    cb_beta: 0.9999
    drw_epoch: null
    normalise: weight_sum
    smooth_head: 0.4
    smooth_tail: 0.1
    posthoc_tau: null
  sampler:
    name: instance
    progressive_epochs: null
    per_class_draw: 4
  optim:
    name: sgd
    lr: 0.05
    momentum: 0.9
    weight_decay: 0.0005
    nesterov: false
    scale_lr: false
    base_batch_size: 128
    sam_rho: 0.0
    sam_tail_below: 0
    sam_tail_weight: 2.0
  schedule:
    name: cosine
    warmup_epochs: 2
    milestones: []
    gamma: 0.1
    update: step
  two_stage:
    crt_epochs: 0
    crt_lr: 0.2
    crt_sampler: class_aware
    crt_bn: reestimate
    crt_reinit: true
    crt_loss:
      name: ce
      args: {}
      label_smoothing: 0.0
      focal_gamma: 1.0
      ldam_max_margin: 0.5
      ldam_scale: 30.0
      tau: 1.0
      reweight: none
      cb_beta: 0.9999
      drw_epoch: null
      normalise: weight_sum
      smooth_head: 0.4
      smooth_tail: 0.1
      posthoc_tau: null
    crt_weight_decay: null
    crt_max_norm: null
    crt_lr_update: epoch
    tau_norm: false
command: []
HPC_TRAIN_JOB_BD32088757C0
            ;;
        1)
cat > "$RUN_DIR/job.yaml" <<'HPC_TRAIN_JOB_BD32088757C0'
name: cifar100-lt
runs_dir: runs
slurm:
  nodes: 1
  gpus_per_node: 1
  tasks_per_node: null
  cpus_per_task: 8
  mem_gb: 0
  time: '12:00:00'
  partition: a100
  account: proj-ml
  qos: normal
  constraint: ib
  exclusive: true
  launcher: srun
  template: default.sbatch.j2
  modules:
  - cuda/12.4
  - nccl/2.21
  module_purge: true
  venv: /shared/envs/lt
  conda_env: null
  python: null
  env:
    NCCL_SOCKET_IFNAME: ^docker,lo
    NCCL_IB_HCA: mlx5_0:1
  container: null
  signal: USR2
  signal_delay_s: 120
  requeue: true
  max_requeues: 3
  hang_timeout_s: 900
  hang_action: fail
  exclude_bad_nodes: true
  gpu_flag: null
  gres_name: gpu
  cpu_bind: null
  srun_args: []
  extra_sbatch:
    mail-type: END
    hint: nomultithread
  master_port_base: 20000
  master_port_span: 12000
  pack: 2
train:
  device: auto
  strategy: ddp
  seed: 1
  epochs: 30
  batch_size: 64
  eval_batch_size: 256
  sync_bn: auto
  tf32: true
  amp: 'off'
  channels_last: false
  amp_weight_copy: true
  compile: false
  compile_cache_dir: null
  cuda_graphs: auto
  cudnn_benchmark: true
  deterministic: false
  num_threads: null
  eval_every_epochs: 1
  checkpoint_every_epochs: 1
  checkpoint_every_s: null
  keep_checkpoints: 2
  log_every_steps: 20
  preempt_check_every_steps: 10
  process_group_timeout_s: 600
  tensorboard: false
  mixup_alpha: 0.0
  data:
    name: digits-lt
    args: {}
    root: data
    imbalance_factor: 20.0
    profile: exp
    seed: 0
    train_list: null
    val_list: null
    test_list: null
    val_fraction: 0.0
    num_classes: 10
    max_per_class: 500
    test_per_class: 50
    image_size: 32
    random_crop_padding: null
    random_flip: null
    num_workers: 4
    download: false
    stage_to: null
    color_jitter: 0.4
  model:
    name: small_cnn
    args: {}
    classifier: linear
  loss:
    name: balanced_softmax
    args: {}
    label_smoothing: 0.0
    focal_gamma: 1.0
    ldam_max_margin: 0.5
    ldam_scale: 30.0
    tau: 1.0
    reweight: none
    cb_beta: 0.9999
    drw_epoch: null
    normalise: weight_sum
    smooth_head: 0.4
    smooth_tail: 0.1
    posthoc_tau: null
  sampler:
    name: instance
    progressive_epochs: null
    per_class_draw: 4
  optim:
    name: sgd
    lr: 0.05
    momentum: 0.9
    weight_decay: 0.0005
    nesterov: false
    scale_lr: false
    base_batch_size: 128
    sam_rho: 0.0
    sam_tail_below: 0
    sam_tail_weight: 2.0
  schedule:
    name: cosine
    warmup_epochs: 2
    milestones: []
    gamma: 0.1
    update: step
  two_stage:
    crt_epochs: 0
    crt_lr: 0.2
    crt_sampler: class_aware
    crt_bn: reestimate
    crt_reinit: true
    crt_loss:
      name: ce
      args: {}
      label_smoothing: 0.0
      focal_gamma: 1.0
      ldam_max_margin: 0.5
      ldam_scale: 30.0
      tau: 1.0
      reweight: none
      cb_beta: 0.9999
      drw_epoch: null
      normalise: weight_sum
      smooth_head: 0.4
      smooth_tail: 0.1
      posthoc_tau: null
    crt_weight_decay: null
    crt_max_norm: null
    crt_lr_update: epoch
    tau_norm: false
command: []
HPC_TRAIN_JOB_BD32088757C0
            ;;
        2)
cat > "$RUN_DIR/job.yaml" <<'HPC_TRAIN_JOB_BD32088757C0'
name: cifar100-lt
runs_dir: runs
slurm:
  nodes: 1
  gpus_per_node: 1
  tasks_per_node: null
  cpus_per_task: 8
  mem_gb: 0
  time: '12:00:00'
  partition: a100
  account: proj-ml
  qos: normal
  constraint: ib
  exclusive: true
  launcher: srun
  template: default.sbatch.j2
  modules:
  - cuda/12.4
  - nccl/2.21
  module_purge: true
  venv: /shared/envs/lt
  conda_env: null
  python: null
  env:
    NCCL_SOCKET_IFNAME: ^docker,lo
    NCCL_IB_HCA: mlx5_0:1
  container: null
  signal: USR2
  signal_delay_s: 120
  requeue: true
  max_requeues: 3
  hang_timeout_s: 900
  hang_action: fail
  exclude_bad_nodes: true
  gpu_flag: null
  gres_name: gpu
  cpu_bind: null
  srun_args: []
  extra_sbatch:
    mail-type: END
    hint: nomultithread
  master_port_base: 20000
  master_port_span: 12000
  pack: 2
train:
  device: auto
  strategy: ddp
  seed: 2
  epochs: 30
  batch_size: 64
  eval_batch_size: 256
  sync_bn: auto
  tf32: true
  amp: 'off'
  channels_last: false
  amp_weight_copy: true
  compile: false
  compile_cache_dir: null
  cuda_graphs: auto
  cudnn_benchmark: true
  deterministic: false
  num_threads: null
  eval_every_epochs: 1
  checkpoint_every_epochs: 1
  checkpoint_every_s: null
  keep_checkpoints: 2
  log_every_steps: 20
  preempt_check_every_steps: 10
  process_group_timeout_s: 600
  tensorboard: false
  mixup_alpha: 0.0
  data:
    name: digits-lt
    args: {}
    root: data
    imbalance_factor: 20.0
    profile: exp
    seed: 0
    train_list: null
    val_list: null
    test_list: null
    val_fraction: 0.0
    num_classes: 10
    max_per_class: 500
    test_per_class: 50
    image_size: 32
    random_crop_padding: null
    random_flip: null
    num_workers: 4
    download: false
    stage_to: null
    color_jitter: 0.4
  model:
    name: small_cnn
    args: {}
    classifier: linear
  loss:
    name: balanced_softmax
    args: {}
    label_smoothing: 0.0
    focal_gamma: 1.0
    ldam_max_margin: 0.5
    ldam_scale: 30.0
    tau: 1.0
    reweight: none
    cb_beta: 0.9999
    drw_epoch: null
    normalise: weight_sum
    smooth_head: 0.4
    smooth_tail: 0.1
    posthoc_tau: null
  sampler:
    name: instance
    progressive_epochs: null
    per_class_draw: 4
  optim:
    name: sgd
    lr: 0.05
    momentum: 0.9
    weight_decay: 0.0005
    nesterov: false
    scale_lr: false
    base_batch_size: 128
    sam_rho: 0.0
    sam_tail_below: 0
    sam_tail_weight: 2.0
  schedule:
    name: cosine
    warmup_epochs: 2
    milestones: []
    gamma: 0.1
    update: step
  two_stage:
    crt_epochs: 0
    crt_lr: 0.2
    crt_sampler: class_aware
    crt_bn: reestimate
    crt_reinit: true
    crt_loss:
      name: ce
      args: {}
      label_smoothing: 0.0
      focal_gamma: 1.0
      ldam_max_margin: 0.5
      ldam_scale: 30.0
      tau: 1.0
      reweight: none
      cb_beta: 0.9999
      drw_epoch: null
      normalise: weight_sum
      smooth_head: 0.4
      smooth_tail: 0.1
      posthoc_tau: null
    crt_weight_decay: null
    crt_max_norm: null
    crt_lr_update: epoch
    tau_norm: false
command: []
HPC_TRAIN_JOB_BD32088757C0
            ;;
    esac
    run_dirs+=("$RUN_DIR")
    points=$(( points + 1 ))
done
echo "hpc-train: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST runs $points packed point(s): ${run_dirs[*]}"
# One step: the runner and its runs share this allocation's cores (8 per run) and GPU.
set +e
srun --kill-on-bad-exit=1 --ntasks=1 --cpus-per-task=16 \
    "$PYTHON" -u -m hpc_train.local --pack "${run_dirs[@]}"
status=$?
set -e
echo "hpc-train: the pack runner exited with status $status"
exit "$status"
