"""Set up one rank and run it: launcher environment → device → process group → run directory → data →
Trainer. Shared by ``python -m hpc_train.train`` and the submitit callable; imports torch.

Order matters for failing fast: the world size and the device are checked before the rendezvous (a
wrong world size would otherwise hang ``init_process_group`` until its timeout), configuration and data
errors raise :class:`~hpc_train.errors.HpcTrainError` (exit 2), and backend switches are applied here,
never at import time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from .. import launch_env
from ..config import JobSpec, dump_yaml
from ..config.sync_bn import decide as batchnorm_decision
from ..config.plugins import is_import_path
from ..errors import ConfigError
from ..rank import heartbeat, preempt
from ..rank.dist import DistEnv, init_process_group
from ..rank.outcome import RunOutcome
from ..runs import rundir

log = logging.getLogger("hpc_train.train")


class _RankFormatter(logging.Formatter):
    def __init__(self, rank: int) -> None:
        super().__init__(f"%(asctime)s [r{rank}] %(message)s", datefmt="%H:%M:%S")


def setup_logging(rank: int) -> None:
    """Rank 0 logs progress (INFO); other ranks only warnings and errors. To stderr, like Slurm's logs
    expect; results (the plan, the final table) go to stdout with print."""
    logger = logging.getLogger("hpc_train")
    for handler in list(logger.handlers):
        if getattr(handler, "_hpc_train", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RankFormatter(rank))
    handler._hpc_train = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False


def wants_cuda(spec: JobSpec) -> bool:
    t = spec.train
    return t.device == "cuda" or (t.device == "auto" and spec.slurm.gpus_per_node > 0)


def select_device(spec: JobSpec, env: DistEnv):
    """``auto``: CUDA when the job asked for GPUs, else CPU; never a silent CPU fallback."""
    if not wants_cuda(spec):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = ("train.device=cuda" if spec.train.device == "cuda"
               else f"the job asks for GPUs (slurm.gpus_per_node={spec.slurm.gpus_per_node})")
        raise ConfigError(
            f"{why} but CUDA is not available on {env.hostname} (torch {torch.__version__}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); fix the node's driver or "
            "torch build, or set train.device=cpu to train on CPUs on purpose"
        )
    index = 0 if spec.train.strategy == "dp" else env.cuda_device_index(torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def configure_backends(spec: JobSpec, env: DistEnv, device) -> None:
    """Threads, determinism, cuDNN and matmul precision: switches from the config, set per run."""
    t = spec.train
    threads = t.num_threads
    if threads is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    if threads is None:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        sharing = env.local_world_size if env.source != "slurm" else 1  # srun binds each task's cores
        threads = max(1, usable // max(1, sharing))
    torch.set_num_threads(threads)
    if t.deterministic:
        # warn_only: a few CUDA kernels (torchvision's adaptive pooling, max-pool backward) have no
        # deterministic version; warn about them instead of failing the run. Our own models avoid them.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = t.cudnn_benchmark
    if device.type == "cuda":
        set_tf32(t.tf32)


def set_tf32(on: bool) -> None:
    """TF32 for float32 matmuls and convolutions, or IEEE float32. One precision API only: torch 2.14
    refuses a mix of the ``fp32_precision`` settings and the older ``allow_tf32`` flags."""
    precision = "tf32" if on else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:  # torch before 2.9
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def default_run_dir(spec: JobSpec) -> Path:
    return rundir.alone_run_dir(spec.runs_dir, spec.name)


def choose_run_dir(spec: JobSpec, explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get(rundir.RUN_DIR_ENV):
        return Path(os.environ[rundir.RUN_DIR_ENV])
    return default_run_dir(spec)


def _broadcast_from_rank0(value: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_record(env: DistEnv, device) -> dict[str, Any]:
    """What this rank saw; the Slurm end-to-end tests compare it with ``hpc-train simulate``."""
    return {
        "rank": env.rank, "local_rank": env.local_rank, "node_rank": env.node_rank,
        "world_size": env.world_size, "local_world_size": env.local_world_size,
        "master_addr": env.master_addr, "master_port": env.master_port, "hostname": env.hostname,
        "source": env.source, "pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": str(device), "job_id": env.job_id, "restart_count": launch_env.restart_count(os.environ, "SLURM_RESTART_COUNT"),
        "host": socket.gethostname(),
    }


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def plan_text(spec: JobSpec, data, *, world_size: int, device_text: str, num_params: int, steps: int,
              crt_steps: int = 0, alone: bool = False) -> str:
    """The plan of the job's launch (``world_size`` ranks); ``alone``: this process is not one of a launch's ranks,
    so `train` here would run one process, which the plan says (it read as if `train` ran them all)."""
    from .observe.metrics import FEW_BELOW, MANY_ABOVE, group_sizes

    t = spec.train
    batchnorm = batchnorm_decision(t, world_size)
    counts = [int(c) for c in data.train_counts]
    groups = group_sizes(counts)
    rows = [" ".join(str(c) for c in counts[i:i + 20]) for i in range(0, len(counts), 20)]
    lines = [
        "hpc-train plan (dry run: nothing is trained)",
        f"  data           {data.name} from {t.data.root} (profile {t.data.profile}, imbalance factor "
        f"{t.data.imbalance_factor:g}, seed {t.data.seed})",
        f"  classes        {data.num_classes}; training images per class, head to tail:",
        *[f"                 {row}" for row in rows],
        f"  total          {sum(counts)} training images, {len(data.val) if data.val is not None else 0} held out, "
        f"{len(data.test)} test images",
        f"  groups         many (>{MANY_ABOVE}) {groups['many']}, medium ({FEW_BELOW}-{MANY_ABOVE}) "
        f"{groups['medium']}, few (<{FEW_BELOW}) {groups['few']}",
        f"  world size     {world_size} ({spec.slurm.nodes} node(s) x {spec.slurm.ranks_per_node} rank(s)), "
        f"strategy {t.strategy}, device {device_text}",
        *([f"  run here       the job's launch (submit, srun) has {world_size} ranks; `train` run alone here is one "
           "process: world size 1"] if alone and world_size > 1 else []),
        f"  batch          global {t.batch_size}, per rank {t.batch_size // world_size}, "
        f"steps per epoch {steps} (sampler {t.sampler.name})",
        f"  batchnorm      {batchnorm.describe()}",
        f"  epochs         {t.epochs}" + (f" + {t.two_stage.crt_epochs} cRT ({crt_steps} steps per epoch, sampler "
                                          f"{t.two_stage.crt_sampler})" if t.two_stage.crt_epochs else "")
        + (", then tau-normalisation" if t.two_stage.tau_norm else ""),
        f"  model          {t.model.name} ({num_params} parameters, {t.model.classifier} classifier)",
        f"  loss           {_loss_text(t.loss)}",
        *_method_lines(t),
    ]
    return "\n".join(lines)


def _loss_text(loss) -> str:
    weighted = loss.reweight == "class_balanced" or loss.drw_epoch is not None
    return loss.name + (f", DRW from epoch {loss.drw_epoch}" if loss.drw_epoch is not None else "") + (
        ", class-balanced weights" if loss.reweight == "class_balanced" else "") + (
        ", normalised by the batch size" if weighted and loss.normalise == "batch_size" else "")


def _method_lines(t) -> list[str]:
    """The plan's lines for SAM / ImbSAM, mixup and stage 2's own settings (only those in use)."""
    o, two, lines = t.optim, t.two_stage, []
    if o.sam_rho:
        tail = (f", ImbSAM: classes with fewer than {o.sam_tail_below} images (tail loss x{o.sam_tail_weight:g})"
                if o.sam_tail_below else ", every class")
        lines.append(f"  sam            rho {o.sam_rho:g}{tail}; two forward-backward passes per step")
    if t.mixup_alpha:
        lines.append(f"  mixup          alpha {t.mixup_alpha:g}, per global batch (main stage)")
    if two.crt_epochs:
        decay = t.optim.weight_decay if two.crt_weight_decay is None else two.crt_weight_decay
        lines.append(f"  stage 2        {'classifier re-initialised' if two.crt_reinit else 'classifier fine-tuned'}, "
                     f"loss {_loss_text(two.crt_loss)}, lr {two.crt_lr:g}, weight decay {decay:g}, BatchNorm "
                     f"{two.crt_bn}" + (f", MaxNorm {two.crt_max_norm:g}" if two.crt_max_norm is not None else "")
                     + (", from the best epoch on the held-out split" if t.data.val_fraction or t.data.val_list else
                        ", from the end of stage 1"))
    return lines


def _check_launcher(spec: JobSpec) -> DistEnv:
    """Who this rank is; a launcher that started another world size than the job's fails here, before a
    rendezvous that would hang until its timeout."""
    env = DistEnv.from_environ()
    if env.source != "single":
        env.check(expected_world_size=spec.slurm.world_size)
    return env


def forward_once(model, data) -> None:
    """One forward pass on a probe batch of the model's input shape, on the CPU: a backbone whose ``feature_dim``
    is not what it gives, or that cannot take the data's images, is exit 2 naming it here, not a traceback at
    step 1."""
    probe = torch.zeros(2, data.in_channels, data.image_size, data.image_size)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(probe)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"train.model: one forward pass on a probe batch {tuple(probe.shape)} failed: {first} "
                          "(a plug-in's feature_dim must be what its backbone gives)") from None
    finally:
        model.train(was_training)
    if tuple(logits.shape) != (2, data.num_classes):
        raise ConfigError(f"train.model: a probe batch {tuple(probe.shape)} gave logits of shape "
                          f"{tuple(logits.shape)}, not (2, {data.num_classes})")


def print_plan(spec: JobSpec, env: DistEnv) -> RunOutcome:
    """Build data, model and loss and print the plan; nothing is trained or written."""
    from .data import datasets
    from .data.samplers import stage_sampler
    from .model.losses import build_loss
    from .model.models import init_model

    t = spec.train
    world = spec.slurm.world_size if (env.source == "single" and t.strategy == "ddp") else env.world_size
    data = datasets.load(t.data, download_ok=False)
    if t.mixup_alpha and not data.in_memory:
        raise ConfigError(f"train.mixup_alpha mixes in-memory data sets; {data.name} streams from disk: set it to 0")
    model = init_model(t, data)
    forward_once(model, data)
    counts = [int(c) for c in data.train_counts]
    for loss in (t.loss, *((t.two_stage.crt_loss,) if t.two_stage.crt_epochs else ())):
        build_loss(loss, counts)
        if is_import_path(loss.name):  # a plug-in loss must give per-sample values (exit 2 otherwise)
            from .model.losses import probe_plugin_loss

            probe_plugin_loss(loss, counts)
    steps = stage_sampler(t, data.train.labels, data.num_classes, "main").steps_per_epoch(t.batch_size)
    crt_steps = (stage_sampler(t, data.train.labels, data.num_classes, "crt").steps_per_epoch(t.batch_size)
                 if t.two_stage.crt_epochs else 0)
    device_text = "cuda" if wants_cuda(spec) else "cpu"
    if wants_cuda(spec) and not torch.cuda.is_available():
        device_text += " (not available on this machine: the ranks need it)"
    print(plan_text(spec, data, world_size=world, device_text=device_text, num_params=count_parameters(model),
                    steps=steps, crt_steps=crt_steps, alone=env.source == "single"), flush=True)
    return RunOutcome(0)


def prepare_run_dir(spec: JobSpec, env: DistEnv, device, run_dir: str | None, job_file: Path | None,
                    distributed: bool) -> Path:
    """The run directory every rank agrees on (rank 0's choice), with what this rank saw and the job."""
    chosen = choose_run_dir(spec, run_dir)
    path = Path(_broadcast_from_rank0(str(chosen)) if distributed else chosen)
    (path / rundir.RANKS_DIR).mkdir(parents=True, exist_ok=True)
    (path / rundir.RANKS_DIR / f"rank-{env.rank}.json").write_text(json.dumps(rank_record(env, device), indent=2) + "\n")
    t = spec.train
    if env.rank == 0:
        config_file = path / rundir.JOB_YAML  # the sbatch script and the local launcher write the same file
        same = job_file is not None and job_file.resolve() == config_file.resolve()
        if not config_file.exists() and not same:
            config_file.write_text(dump_yaml(spec), encoding="utf-8")
        log.info("run directory %s; %d rank(s) (%s), device %s, amp %s, channels_last %s, compile %s",
                 path, env.world_size, env.source, device, t.amp, t.channels_last, t.compile)
    per_device = t.batch_size // env.world_size if t.strategy == "ddp" else t.batch_size // max(
        1, torch.cuda.device_count() if device.type == "cuda" else 1)
    unsynced = not batchnorm_decision(t, env.world_size).on
    if per_device < 16 and unsynced and env.rank == 0:
        log.warning("batch per device is %d (< 16) and BatchNorm is not synchronised: its statistics get "
                    "noisy; raise train.batch_size, or set train.sync_bn to auto or true (ddp)", per_device)
    return path


def load_data(spec: JobSpec, env: DistEnv, device, path: Path, distributed: bool):
    """The data set on this rank: staged to node-local disk first when asked, downloaded by one rank per
    node when allowed; rank 0 records the class counts."""
    from .data import datasets
    from .loop.context import barrier

    t = spec.train
    image_root = None
    if t.data.name == "list" and t.data.stage_to:
        image_root = Path(os.path.expandvars(t.data.stage_to)).expanduser()
        # The ranks of a node split the copying (and each node copies for itself).
        copied = datasets.stage_list_files(t.data, image_root, part=env.local_rank, parts=env.local_world_size)
        log.info("staged %d image files to %s", copied, image_root)
        if distributed:
            barrier(device)
    if t.data.download and env.local_rank != 0 and distributed:
        barrier(device)  # local rank 0 downloads first
    data = datasets.load(t.data, image_root=image_root, download_ok=env.local_rank == 0)
    if t.data.download and env.local_rank == 0 and distributed:
        barrier(device)
    if env.rank == 0:
        (path / "class_counts.json").write_text(json.dumps(
            {"dataset": data.name, "train_counts": [int(c) for c in data.train_counts],
             "class_names": data.class_names}) + "\n", encoding="utf-8")
    return data


@contextlib.contextmanager
def process_group(spec: JobSpec, env: DistEnv, device) -> Iterator[bool]:
    """The process group for the run (yields whether there is one). On a clean end — finished, preempted,
    or refused with a message — the ranks leave together: rank 0 still writes the summary and the plot
    when the others are done, and a rank that tears gloo down while a peer is busy has been seen to abort
    at exit ("terminate called without an active exception"), failing a finished job."""
    from ..errors import HpcTrainError
    from .loop.context import barrier

    distributed = env.world_size > 1
    if distributed:
        init_process_group(env, backend="nccl" if device.type == "cuda" else "gloo",
                           timeout_s=spec.train.process_group_timeout_s)
    clean = False
    try:
        yield distributed
        clean = True
    except HpcTrainError:
        clean = True
        raise
    finally:
        if distributed and clean and dist.is_initialized():
            try:
                barrier(device)
            except Exception as exc:  # a peer is gone: nothing to wait for
                log.warning("final barrier failed (%s); leaving without it", exc)
            dist.destroy_process_group()


def run(spec: JobSpec, *, run_dir: str | None = None, dry_run: bool = False,
        job_file: Path | None = None) -> RunOutcome:
    """Run this rank. Raises HpcTrainError (exit 2) for bad config or data; returns the outcome (the
    exit code is 0, or a preemption code from :mod:`.preempt`)."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a failed collective aborts, never hangs
    if spec.train.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises
    from .loop.context import RankContext
    from .loop.engine import Trainer
    from .observe import progress

    env = _check_launcher(spec)
    setup_logging(env.rank)
    if dry_run:
        return print_plan(spec, env)
    device = select_device(spec, env)
    configure_backends(spec, env, device)
    with process_group(spec, env, device) as distributed:
        path = prepare_run_dir(spec, env, device, run_dir, job_file, distributed)
        heartbeat.start(path, env.rank, local_rank=env.local_rank, host=env.hostname)  # first beat: the first step check
        data = load_data(spec, env, device, path, distributed)
        ctx = RankContext(env=env, device=device, rank=env.rank, world_size=env.world_size, distributed=distributed)
        try:
            summary = Trainer(spec, ctx, data, path).fit()
        except preempt.Preempted as stop:
            return RunOutcome(stop.exit_code, path, {"preempted": True, "requeued": stop.requeued,
                                                     "checkpoint": stop.checkpoint}, str(stop))
        finally:
            progress.wait_for_pictures()  # drawn after the end line and summary.json, while the ranks took leave
        return RunOutcome(0, path, summary)
