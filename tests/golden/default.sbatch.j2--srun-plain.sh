#!/bin/bash
# cifar100-lt: rendered by hpc-train 0.1.0 from default.sbatch.j2
# 4 node(s) x 8 rank(s) = 32 rank(s), launcher srun
# BatchNorm: synchronised across ranks (sync_bn: auto, 2 images per rank < 32)
#SBATCH --job-name=cifar100-lt
#SBATCH --nodes=4
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --mem=0G
#SBATCH --time=12:00:00
#SBATCH --partition=a100
#SBATCH --account=proj-ml
#SBATCH --qos=normal
#SBATCH --constraint=ib
#SBATCH --exclusive
#SBATCH --signal=USR2@120
#SBATCH --requeue
#SBATCH --output=slurm-%x-%j.out
#SBATCH --error=slurm-%x-%j.out
#SBATCH --open-mode=append
#SBATCH --hint=nomultithread
#SBATCH --mail-type=END

# The job's values, each one shell word in a read-only variable (hpc_train/render/variables.py): the
# script below reads them and never holds job text as code.
readonly HT_RUN_GROUP=/shared/project/runs/cifar100-lt
readonly HT_PYTHON=/shared/envs/lt/bin/python
readonly HT_CPUS_PER_TASK=8
readonly -a HT_MODULES=(cuda/12.4 nccl/2.21)
readonly HT_HANG_TIMEOUT_S=900
readonly HT_MASTER_PORT_BASE=20000
readonly HT_MASTER_PORT_SPAN=12000
readonly HT_SBATCH_TASKS_PER_NODE=8
readonly HT_VENV_ACTIVATE=/shared/envs/lt/bin/activate
readonly HT_JOB_YAML='name: cifar100-lt
runs_dir: runs
slurm:
  nodes: 4
  gpus_per_node: 8
  tasks_per_node: null
  cpus_per_task: 8
  mem_gb: 0
  time: '"'"'12:00:00'"'"'
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
  pack: 1
train:
  device: auto
  strategy: ddp
  seed: 0
  epochs: 30
  batch_size: 64
  eval_batch_size: 256
  sync_bn: auto
  tf32: true
  amp: '"'"'off'"'"'
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
workdir: run
'

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
module load "${HT_MODULES[@]}"

# shellcheck disable=SC1090,SC1091
. "$HT_VENV_ACTIVATE"
PYTHON="$HT_PYTHON"
# Slurm >= 22.05: srun no longer inherits --cpus-per-task from sbatch.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-$HT_CPUS_PER_TASK}"
export OMP_NUM_THREADS="$HT_CPUS_PER_TASK"
# A dead rank ends the job with its name instead of blocking every other rank until the time limit.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_ASYNC_ERROR_HANDLING=1
export PYTHONUNBUFFERED=1
# The ranks' heartbeats follow the watchdog's timeout (hpc_train/rank/heartbeat.py).
export HPC_TRAIN_HANG_TIMEOUT_S="$HT_HANG_TIMEOUT_S"
# The job's slurm.env, each value one shell word.
export NCCL_IB_HCA=mlx5_0:1
export NCCL_SOCKET_IFNAME='^docker,lo'

# --- writing run-directory files -----------------------------------------------------------------
# A run directory may be shared (a resumed run, a group's runs_dir): a link, FIFO or directory planted as one of
# its files must never redirect this script's writes. Bash's `>`/`>>` follow links, so the script writes only
# through these, as hpc_train/runs/safe_files.py does in Python (coreutils only: no hpc-train on the PATH
# needed, so a container job's host needs nothing more).
run_file_append() {  # printf ... | run_file_append FILE: one line, appended with O_APPEND|O_NOFOLLOW|O_NONBLOCK
    # (a link is refused, not followed; a FIFO is refused, not waited on), in one write (fullblock), so lines of
    # concurrent writers never interleave.
    dd of="$1" oflag=append,nofollow,nonblock conv=notrunc bs=1M iflag=fullblock status=none ||
        { echo "hpc-train: error: cannot append to $1: not a regular file of the run (a link, FIFO or directory planted there?)" >&2; return 2; }
}
run_file_write() {  # printf ... | run_file_write FILE: whole or not at all, through a new file renamed over FILE
    # (a link there is replaced, never followed; a directory there is refused).
    local tmp
    tmp="$(mktemp "$1.XXXXXX")" || return 2
    if cat > "$tmp" && chmod "$(printf '%o' $(( 0666 & ~0$(umask) )))" "$tmp" && mv -fT "$tmp" "$1"; then
        return 0
    fi
    rm -f "$tmp"
    echo "hpc-train: error: cannot write $1 (a directory planted there?)" >&2
    return 2
}
run_logs_dir() {  # mkdir -p DIR/logs, refusing a link planted as logs/ or as a rank's log (srun's --output follows links)
    local planted
    if [ -L "$1/logs" ]; then
        echo "hpc-train: error: $1/logs is a link, not the run's directory of logs: refusing to write through it" >&2
        return 2
    fi
    mkdir -p "$1/logs"
    planted="$(find "$1/logs" -mindepth 1 -maxdepth 1 \( -name 'rank-*.log' -o -name 'node-*.log' \) ! -type f -print -quit)"
    if [ -n "$planted" ]; then
        echo "hpc-train: error: $planted is not a regular file: refusing to write the ranks' output through it" >&2
        return 2
    fi
}

# --- run directory -----------------------------------------------------------------------------
# Keyed on the job id (array: <array job id>_<task id>), which survives `scontrol requeue`, so a
# requeued job finds its checkpoints.
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
    RUN_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
else
    RUN_ID="${SLURM_JOB_ID:?not running under Slurm (SLURM_JOB_ID is unset)}"
fi
RUN_DIR="$HT_RUN_GROUP/$RUN_ID"
run_logs_dir "$RUN_DIR"
export HPC_TRAIN_RUN_DIR="$RUN_DIR"
# The run's state, one line per change (hpc_train/runs/rundir.py reads them for `hpc-train status`): this
# launch started here, and the exit block below records how it ended.
run_event() {  # run_event EVENT [EXIT_CODE]
    printf '{"event": "%s", "writer": "launcher", "instance": "slurm:%s.%s", "restart": %s, "job_id": "%s", "exit_code": %s, "host": "%s", "nodes": "%s", "time": "%s"}\n' \
        "$1" "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" "${SLURM_RESTART_COUNT:-0}" "$SLURM_JOB_ID" "${2:-null}" \
        "$(hostname -s)" "$SLURM_JOB_NODELIST" "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" | run_file_append "$RUN_DIR/state.jsonl"
}
run_event running
# The fully resolved job (site file, job file, --set and flags applied): what every rank runs.
printf '%s' "$HT_JOB_YAML" | run_file_write "$RUN_DIR/job.yaml"
# The batch log (#SBATCH --output) beside the rank logs, wherever the template put it.
batch_log="$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -n 1 || true)"
if [ -n "$batch_log" ]; then
    ln -sfn "$batch_log" "$RUN_DIR/logs/batch.log"
fi
echo "hpc-train: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, run dir $RUN_DIR"
# A requeued attempt: the node that ended the previous one is excluded (slurm.exclude_bad_nodes); an attempt that
# landed on an excluded node updates the job's ExcNodeList and requeues itself.
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ -s "$RUN_DIR/excluded_nodes.json" ]; then
    set +e
    "$PYTHON" -u -m hpc_train.slurm.watchdog start-check "$RUN_DIR"
    check_status=$?
    set -e
    if [ "$check_status" -eq 125 ]; then
        exit 0
    fi
fi

# --- rendezvous --------------------------------------------------------------------------------
# Computed once here, on the first node (where the batch shell runs), and exported to every rank:
# ranks need neither scontrol (absent in containers) nor a node-list parser.
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1 || true)"
if [ -z "$MASTER_ADDR" ]; then
    MASTER_ADDR="$("$PYTHON" -c 'import sys; from hpc_train.hostlist import expand; print(expand(sys.argv[1])[0])' "$SLURM_JOB_NODELIST")"
fi
if [ -z "$MASTER_ADDR" ]; then
    echo "hpc-train: cannot determine MASTER_ADDR from SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2
    exit 2
fi
export MASTER_ADDR
# A port derived from the job id (never a constant: jobs share nodes), moved on while something listens
# on it. SO_REUSEADDR as torch's TCPStore sets it: connections left in TIME_WAIT by an earlier run (a
# requeue keeps the job id) do not make a port busy.
port_base="$HT_MASTER_PORT_BASE"
port_span="$HT_MASTER_PORT_SPAN"
port_offset=$(( (${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID} + ${SLURM_ARRAY_TASK_ID:-0}) % port_span ))
for _ in $(seq 1 100); do
    MASTER_PORT=$(( port_base + port_offset ))
    if "$PYTHON" -c 'import socket as s, sys; p = s.socket(); p.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1); p.bind(("", int(sys.argv[1])))' "$MASTER_PORT" 2>/dev/null; then
        break
    fi
    port_offset=$(( (port_offset + 1) % port_span ))
done
export MASTER_PORT
echo "hpc-train: MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"

# --- launch: one Slurm task per rank -----------------------------------------------------------
# Each task maps SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS to RANK/LOCAL_RANK/WORLD_SIZE itself
# (hpc_train.dist.DistEnv). --kill-on-bad-exit: one crashing rank ends the step at once;
# --wait=60: a rank that exits early does not leave the others waiting forever.
set +e
# The step runs in the background, beside the watchdog (below): a function, so the srun lines stay as they are.
launch_step() {
srun --kill-on-bad-exit=1 --wait=60 \
    --ntasks-per-node="$HT_SBATCH_TASKS_PER_NODE" --cpus-per-task="$HT_CPUS_PER_TASK" \
    --output="$RUN_DIR/logs/rank-%t.log" \
    "$PYTHON" -u -m hpc_train.train --resolved "$RUN_DIR/job.yaml"
}
launch_step &
srun_pid=$!
# The watchdog (hpc_train/slurm/watchdog.py): when no rank has advanced for slurm.hang_timeout_s (HT_HANG_TIMEOUT_S)
# after its first heartbeat, it dumps the ranks' stacks into their logs, names the rank that stopped first and
# its host, ends the step and records the run failed.
"$PYTHON" -u -m hpc_train.slurm.watchdog watch "$RUN_DIR" "$srun_pid" &
watchdog_pid=$!
while true; do
    wait "$srun_pid"
    status=$?
    kill -0 "$srun_pid" 2>/dev/null || break
done
# The step has ended: stop the watchdog (it finishes first when it is the one that ended the step).
kill -TERM "$watchdog_pid" 2>/dev/null || true
wait "$watchdog_pid"
watchdog_status=$?
if [ "$watchdog_status" -eq 125 ]; then
    echo "hpc-train: the watchdog ended the hung step and requeued the job"
    exit 0
fi
if [ "$watchdog_status" -eq 124 ]; then
    status=124
fi
set -e
echo "hpc-train: srun exited with status $status"
# srun reports how the ranks ended, not why: a run that checkpointed on the signal but may not requeue
# (max_requeues reached) exits 75, the trainer's "continue me" code, whatever the killed ranks returned.
# The exit code becomes the run's state (hpc_train/runs/rundir.py: 0 completed, 75 preempted, else failed).
# (Read only as a regular file, not a link: a FIFO planted there would block this script until its time limit.)
state_log="$RUN_DIR/state.jsonl"
if [ "$status" -ne 0 ] && [ -f "$state_log" ] && [ ! -L "$state_log" ] &&
        tail -n 1 "$state_log" 2>/dev/null | grep -q '"event": "preempted"'; then
    echo "hpc-train: checkpointed but not requeued; continue with: hpc-train submit --resume $RUN_DIR"
    status=75
fi
run_event exit "$status" || true
exit "$status"
