"""Job configuration: typed, frozen dataclasses, YAML loading, layered overrides, validation.

The dataclass fields *are* the schema: a job file, a site file or a ``--set`` path that names a key
which is not a field is rejected with the list of valid keys. Layers, lowest first:

    built-in defaults < site file < job file < --set key=value < explicit CLI flags

Everything here is torch-free and click-free; errors are :class:`ConfigError` (exit 2).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from .errors import ConfigError

# --------------------------------------------------------------------------------------------------
# Slurm side
# --------------------------------------------------------------------------------------------------

Launcher = Literal["srun", "torchrun"]
GpuFlag = Literal["gpus-per-node", "gres"]
ContainerRuntime = Literal["apptainer", "pyxis"]

# Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_RE = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")


def time_to_minutes(value: str) -> int:
    """Minutes of a Slurm ``--time`` string (rounded up, as Slurm does). Raises ValueError."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise ValueError(value)
    if m.group(1) is not None:  # D-HH[:MM[:SS]]
        days, hours = int(m.group(1)), int(m.group(2))
        minutes, seconds = int(m.group(3) or 0), int(m.group(4) or 0)
    else:
        parts = [int(p) for p in (m.group(5), m.group(6), m.group(7)) if p is not None]
        days = 0
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_s // 60)


@dataclass(frozen=True, kw_only=True)
class ContainerConfig:
    """Run every task inside a container (the image must hold Python and hpc-train[train])."""

    runtime: ContainerRuntime = "apptainer"
    """``apptainer`` wraps the launch command in ``apptainer exec --nv``; ``pyxis`` adds
    ``--container-image`` to srun (enroot/pyxis sites)."""
    image: str = ""
    """Image path (apptainer .sif) or reference (pyxis, e.g. ``nvcr.io#nvidia/pytorch:24.05-py3``)."""
    binds: tuple[str, ...] = ()
    """Host paths made visible in the container (``src[:dst]``). The submit directory is added."""


@dataclass(frozen=True, kw_only=True)
class SlurmConfig:
    """What the sbatch script asks Slurm for, and how it launches the ranks."""

    nodes: int = 1
    """Number of nodes."""
    gpus_per_node: int = 0
    """GPUs per node. 0 runs on CPUs (gloo)."""
    tasks_per_node: int | None = None
    """Training processes (ranks) per node. Unset: one per GPU (``gpus_per_node``), or 1 without GPUs."""
    cpus_per_task: int = 4
    """CPU cores per rank (data loading threads, OMP_NUM_THREADS)."""
    mem_gb: int | None = None
    """Memory per node in GB; 0 asks for all of it; unset leaves the partition default."""
    time: str = "01:00:00"
    """Wall-time limit in Slurm's format (``MM``, ``HH:MM:SS``, ``D-HH:MM`` ...)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    """Ask for whole nodes (``--exclusive``)."""
    launcher: Launcher = "srun"
    """``srun``: one Slurm task per rank (default). ``torchrun``: one task per node, c10d rendezvous."""
    template: str = "default.sbatch.j2"
    """The sbatch template file, looked up on the template search path (site dirs first)."""
    modules: tuple[str, ...] = ()
    """Environment modules to load after ``module purge`` (Lmod or Environment Modules)."""
    module_purge: bool = True
    """Run ``module purge`` before loading ``modules`` (only when modules are given)."""
    venv: str | None = None
    """A virtualenv to activate on the nodes (its ``bin/activate`` is sourced)."""
    conda_env: str | None = None
    """A conda environment to activate on the nodes (conda.sh is sourced first)."""
    python: str | None = None
    """Interpreter that runs the ranks. Unset: ``python`` of the activated venv/conda env, else the
    interpreter that ran ``hpc-train``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank (NCCL/IB settings usually come from the site file)."""
    container: ContainerConfig | None = None
    signal: str = "USR2"
    """Signal Slurm sends before the time limit (and on preemption); it triggers checkpoint + requeue.
    Not USR1: NCCL uses it."""
    signal_delay_s: int = 120
    """Seconds before the time limit at which ``signal`` is sent."""
    requeue: bool = True
    """Requeue the job after a checkpoint on preemption or time limit."""
    max_requeues: int = 3
    """Give up requeueing after this many restarts (``SLURM_RESTART_COUNT``)."""
    gpu_flag: GpuFlag | None = None
    """How GPUs are requested: ``--gpus-per-node=N`` or ``--gres=gpu:N``. Unset: ``--gpus-per-node``
    (preflight picks by Slurm version). Usually set once in the site file."""
    gres_name: str = "gpu"
    """GRES name for ``gres`` (``--gres=<name>:N``), some sites use typed names like ``gpu:a100``."""
    cpu_bind: str | None = None
    """``srun --cpu-bind=`` value (e.g. ``none`` on partitions with non-contiguous masks)."""
    srun_args: tuple[str, ...] = ()
    """Extra srun arguments, each one word (they are quoted)."""
    extra_sbatch: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``#SBATCH`` keys: ``{mail-type: END}`` → ``#SBATCH --mail-type=END``; ``true`` → bare flag."""
    master_port_base: int = 20000
    """MASTER_PORT = base + (job id [+ array task id]) mod ``master_port_span``, bind-checked on node 1."""
    master_port_span: int = 12000
    """Range of candidate MASTER_PORTs (20000-31999 by default): below the kernel's ephemeral ports (32768
    and up), and the range the Ansible role opens in the firewall (slurm_gpu_node_rendezvous_port_range)."""

    @property
    def ranks_per_node(self) -> int:
        """Training processes per node, whatever the launcher."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def sbatch_tasks_per_node(self) -> int:
        """``--ntasks-per-node``: every rank is a task under srun; torchrun is one task per node."""
        return 1 if self.launcher == "torchrun" else self.ranks_per_node

    @property
    def sbatch_cpus_per_task(self) -> int:
        """``--cpus-per-task``: torchrun's single task holds the cores of all its workers."""
        if self.launcher == "torchrun":
            return self.cpus_per_task * self.ranks_per_node
        return self.cpus_per_task

    @property
    def time_min(self) -> int:
        return time_to_minutes(self.time)


# --------------------------------------------------------------------------------------------------
# Training side (what every rank runs; consumed by hpc_train/train/)
# --------------------------------------------------------------------------------------------------

DatasetName = Literal["cifar10-lt", "cifar100-lt", "list", "imagefolder", "digits-lt", "synthetic-lt"]
ModelName = Literal[
    "resnet32", "small_cnn", "resnet18", "resnet34", "resnet50", "resnet101",
    "resnext50_32x4d", "resnext101_32x8d",
]  # fmt: skip
LossName = Literal["ce", "focal", "ldam", "balanced_softmax", "logit_adjusted"]
SamplerName = Literal["instance", "class_balanced", "sqrt", "progressive", "class_aware"]


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which images, how the long tail is made, and how batches are produced."""

    name: DatasetName = "digits-lt"
    """Data set: CIFAR-LT from the official python pickles, a list file, an ImageFolder tree,
    ``digits-lt`` (scikit-learn's bundled real digits) or ``synthetic-lt`` (generated)."""
    root: str = "data"
    """Directory holding the data set files: ``cifar-10-batches-py`` / ``cifar-100-python`` for CIFAR,
    the image root of list files, the ``train/`` and ``test/`` (or ``val/``) folders of ImageFolder."""
    imbalance_factor: float = 100.0
    """n_max / n_min of the training set (1 keeps it balanced)."""
    profile: Literal["exp", "step"] = "exp"
    """How class sizes fall from head to tail (LDAM-DRW's ``exp`` and ``step``)."""
    seed: int = 0
    """Seed of the long-tail subsampling and of the held-out splits (LDAM-DRW uses 0)."""
    train_list: str | None = None
    """List-file data sets: ``relative/path label`` per line, paths relative to ``root`` (the list
    file itself: absolute, or relative to ``root``)."""
    val_list: str | None = None
    """List-file held-out split (used to choose τ; never the test list)."""
    test_list: str | None = None
    """List-file test split (what the reported accuracies are measured on)."""
    val_fraction: float = 0.0
    """Held-out fraction of the training set per class (at least one image per class), for choosing
    τ. It shrinks the training set, so the published CIFAR-LT counts hold only at 0."""
    num_classes: int = 10
    """Classes of ``synthetic-lt`` (the other data sets know their own)."""
    max_per_class: int = 500
    """Head-class size of ``synthetic-lt``; cap on the head class of long-tail subsampled ImageFolder sets."""
    test_per_class: int = 50
    """Balanced test images per class of ``digits-lt`` (held out from the real digits before the long
    tail is cut) and of ``synthetic-lt``."""
    image_size: int = 32
    """Side of the training crops of on-disk sets (list, ImageFolder: 224 for ImageNet-style data) and of
    ``synthetic-lt`` images. CIFAR is 32 and digits 8 whatever this says."""
    random_crop_padding: int | None = None
    """Random-crop padding of in-memory sets (zero padding, crop back to size). Unset: 4 for 32-pixel
    sets (the CIFAR recipe), 1 for the 8-pixel digits."""
    random_flip: bool | None = None
    """Random horizontal flips. Unset: on, except for ``digits-lt`` (a flipped digit is another glyph)."""
    num_workers: int = 4
    """DataLoader workers per rank for on-disk (large) data sets; in-memory sets ignore it."""
    download: bool = False
    """Allow downloading CIFAR when the files are missing (never on by default)."""
    stage_to: str | None = None
    """Copy a list-file data set's images to this node-local directory before training (e.g. ``/tmp``
    or ``$TMPDIR``); one rank per node copies, files already there with the same size are kept."""
    color_jitter: float = 0.4
    """Brightness, contrast and saturation jitter of on-disk training images (list, ImageFolder):
    classifier-balancing's ``ColorJitter(0.4, 0.4, 0.4, 0)`` for ImageNet-LT and Places-LT; 0 turns it
    off. In-memory sets (CIFAR, digits, synthetic) ignore it."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The network: a backbone that produces features and a classifier on top."""

    name: ModelName = "small_cnn"
    """``resnet32`` (CIFAR ResNet, option-A shortcuts), ``small_cnn`` (digits), or a torchvision
    ResNet/ResNeXt built without pretrained weights."""
    classifier: Literal["linear", "cosine"] = "linear"
    """``cosine`` normalises features and weights (LDAM's NormedLinear; the loss applies
    ``loss.ldam_scale``, so pair it with ``ldam``)."""


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Training loss and per-class re-weighting."""

    name: LossName = "ce"
    """``ce``, ``focal``, ``ldam``, ``balanced_softmax`` (logits + log n_c) or ``logit_adjusted``
    (logits + τ log π_c)."""
    label_smoothing: float = 0.0
    """Label smoothing of ``ce`` (the other losses reject it rather than ignore it)."""
    focal_gamma: float = 1.0
    """Focusing parameter γ of ``focal`` (LDAM-DRW uses 1)."""
    ldam_max_margin: float = 0.5
    """Largest LDAM margin (the rarest class's); margins fall as n_c^-1/4."""
    ldam_scale: float = 30.0
    """Logit scale s of LDAM (needed with the cosine classifier, whose logits lie in [-1, 1])."""
    tau: float = 1.0
    """Temperature of the logit-adjusted loss (1.0 is the paper's choice)."""
    reweight: Literal["none", "class_balanced"] = "none"
    """Per-class loss weights from the start (effective number of samples, ``cb_beta``)."""
    cb_beta: float = 0.9999
    """β of the class-balanced weights (1-β)/(1-β^n_c), normalised to sum to the number of classes."""
    drw_epoch: int | None = None
    """Deferred re-weighting: class-balanced weights from this epoch index on (LDAM-DRW: 160)."""
    posthoc_tau: float | None = None
    """Also evaluate with post-hoc logit adjustment, logits - tau * log(prior) (reported as ``posthoc``)."""


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """How training indices are drawn; every sampler is distributed-aware (one global sequence per epoch)."""

    name: SamplerName = "instance"
    """``instance`` (a permutation), ``class_balanced`` (class uniform, then instance), ``sqrt`` (class
    ∝ sqrt(n_c)) or ``progressive`` (instance → class-balanced over ``progressive_epochs``)."""
    progressive_epochs: int | None = None
    """Progressively balanced: epochs over which sampling moves from instance to class-balanced
    (default: all epochs of the stage)."""
    per_class_draw: int = 4
    """``class_aware``: images taken from a class each time the class comes up (classifier-balancing's
    ``num_samples_cls``)."""


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimizer (weight decay applies to every parameter, as in LDAM-DRW)."""

    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.1
    """Learning rate for ``batch_size`` (the global batch)."""
    momentum: float = 0.9
    """SGD momentum (AdamW ignores it)."""
    weight_decay: float = 2e-4
    nesterov: bool = False
    scale_lr: bool = False
    """Linear scaling: lr * batch_size / ``base_batch_size``."""
    base_batch_size: int = 128
    """The batch size ``lr`` was tuned for (used by ``scale_lr``)."""


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """Learning-rate schedule, a pure function of (epoch, step) so resuming needs no extra state."""

    name: Literal["multistep", "cosine", "constant"] = "multistep"
    """``multistep``: ×gamma at each milestone; ``cosine``: per-step cosine to 0 after warm-up."""
    warmup_epochs: int = 0
    """Linear warm-up per epoch: lr * (epoch + 1) / warmup_epochs for the first epochs (LDAM-DRW: 5)."""
    milestones: tuple[int, ...] = ()
    """``multistep``: epoch indices where lr is multiplied by ``gamma`` (cumulatively)."""
    gamma: float = 0.1
    """``multistep`` factor per milestone (LDAM-DRW: 0.01 at 160 and again at 180)."""
    update: Literal["step", "epoch"] = "step"
    """``cosine``: the lr changes every optimizer step, or once per epoch as classifier-balancing's
    ``CosineAnnealingLR`` stepped at the start of each epoch (epoch e runs at the rate of e + 1, so
    the last epoch runs at 0)."""


@dataclass(frozen=True, kw_only=True)
class TwoStageConfig:
    """Decoupled classifier re-training (cRT) and τ-normalisation after the main training."""

    crt_epochs: int = 0
    """Epochs of classifier re-training with frozen features and class-balanced sampling (0: off)."""
    crt_lr: float = 0.2
    """Peak lr of cRT (cosine schedule, no warm-up; scaled like ``optim.lr`` when ``scale_lr``)."""
    crt_sampler: SamplerName = "class_aware"
    """Sampler of the cRT epochs (default: classifier-balancing's class-aware sampler, with
    ``sampler.per_class_draw`` images per draw and floor(N / batch) steps per epoch)."""
    crt_bn: Literal["reestimate", "frozen"] = "reestimate"
    """BatchNorm in cRT: ``reestimate`` keeps the frozen backbone in training mode, so its statistics are
    re-estimated on the class-balanced batches (classifier-balancing); ``frozen`` keeps stage 1's."""
    crt_lr_update: Literal["step", "epoch"] = "epoch"
    """When cRT's cosine lr changes (see ``schedule.update``; ``epoch`` is classifier-balancing's)."""
    tau_norm: bool = False
    """τ-normalise the classifier weights (w_c / ||w_c||^τ, bias dropped); τ is picked on the held-out
    split (``data.val_fraction`` or ``data.val_list``) from 0, 0.1, ..., 2, never on test."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What every rank runs: data, model, loss, sampler, optimizer, schedule and the run mechanics."""

    device: Literal["auto", "cuda", "cpu"] = "auto"
    """``auto`` uses CUDA when the job asked for GPUs and fails when CUDA is missing; ``cpu`` forces CPU."""
    strategy: Literal["ddp", "dp", "none"] = "ddp"
    """``ddp`` (one process per device); ``dp`` legacy single-process DataParallel over the visible
    GPUs of one node (kept for old recipes; slower than DDP); ``none`` (one process, one device)."""
    seed: int = 0
    """Seed of model initialisation, sampling and augmentation (data subsampling uses ``data.seed``)."""
    epochs: int = 30
    """Epochs of the main training (cRT epochs come on top)."""
    batch_size: int = 128
    """Global batch (all ranks together); must split evenly across ranks."""
    eval_batch_size: int = 256
    """Evaluation batch per rank."""
    sync_bn: Literal["auto", True, False] = "auto"
    """Synchronised BatchNorm across ranks (statistics of the whole global batch). ``auto``: on when
    a rank's batch is below 32 images and more than one rank trains (one log line says so). On at
    every world size > 1 it makes the weights independent of the world size. CUDA uses PyTorch's
    SyncBatchNorm, CPUs (gloo) hpc-train's own."""
    tf32: bool = True
    """TF32 for float32 matmuls and convolutions on Ampere and newer GPUs (faster, ~1e-3 relative
    precision). Off: IEEE float32, as the reference implementations ran."""
    amp: Literal["off", "bf16", "fp16"] = "off"
    """Mixed precision: ``bf16`` (A100/H100 and newer), ``fp16`` with a gradient scaler (V100/T4), ``off``."""
    channels_last: bool = False
    """NHWC memory format for model and inputs (faster convolutions with AMP on tensor cores)."""
    compile: bool = False
    """``torch.compile`` the model (the first steps are slow while it compiles; one graph per batch shape,
    never recompiled). Combined with ``cuda_graphs``, the compiled step is captured."""
    compile_cache_dir: str | None = None
    """Persistent compile cache (``TORCHINDUCTOR_CACHE_DIR``; ``$VARS`` and ``~`` expanded), so the second
    run of a recipe compiles in seconds; a site file can point it at a shared filesystem. Unset: torch's
    default (``/tmp/torchinductor_$USER``, per node)."""
    cuda_graphs: Literal["auto", True, False] = "auto"
    """Capture the whole training step (batch gather, augmentation, forward, loss, backward, optimizer)
    as CUDA graphs, one per batch shape, and replay them: no host work and no host synchronisation per
    step. ``auto``: on for CUDA at world size 1 with an in-memory data set, not fp16, not ``dp`` (one log
    line says why when off); ``on`` (``true``): also at world size > 1, where the gradient all-reduce is
    captured (unverified on GPUs); ``off`` (``false``): eager steps. A capture that fails falls back to
    eager steps with one log line."""
    cudnn_benchmark: bool = True
    """Let cuDNN pick the fastest convolution algorithms (ignored when ``deterministic``)."""
    deterministic: bool = False
    """Deterministic kernels (slower); resume tests use it on CPU."""
    num_threads: int | None = None
    """CPU threads per rank (intra-op). Unset: ``$OMP_NUM_THREADS``, else the usable cores divided by
    the ranks on this node."""
    eval_every_epochs: int = 1
    """Evaluate on the test split every this many epochs (and always after the last one)."""
    checkpoint_every_epochs: int = 1
    """Checkpoint every this many epochs (and always at the end and on preemption)."""
    checkpoint_every_s: float | None = None
    """Periodic checkpoints by time instead: at the first step boundary where the ranks agree (every
    ``preempt_check_every_steps``) at least this many seconds after the previous checkpoint (rank 0's
    clock), mid-epoch included; ``checkpoint_every_epochs`` is then ignored. Always one at the end of
    each stage and on preemption. Checkpoints are copied to host memory and written in the background."""
    keep_checkpoints: int = 2
    """Checkpoints kept in the run directory (older ones are deleted after a successful save)."""
    log_every_steps: int = 50
    """Progress line (epoch, step, loss, lr, images/s, ETA) every this many steps, from rank 0."""
    preempt_check_every_steps: int = 10
    """How often ranks agree on whether a preemption signal arrived (and a time-based checkpoint or a
    non-finite loss); also at every epoch end. With several ranks the agreement is a non-blocking
    all-reduce on the CPU whose answer is read at the next check, so a signal is acted on within two
    intervals. Small against the signal's lead time (``slurm.signal_delay_s``)."""
    process_group_timeout_s: int = 600
    """A dead or stuck rank ends the job after this long instead of blocking to the time limit."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    two_stage: TwoStageConfig = field(default_factory=TwoStageConfig)


# --------------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------------

# A job name becomes a directory name and an #SBATCH value: anything printable except '/'.
_NAME_FORBIDDEN = re.compile(r"[/\x00-\x1f\x7f]")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A fully resolved job: what ``render`` turns into an sbatch script and every rank runs."""

    name: str = "hpc-train"
    """Job name (Slurm ``--job-name``) and the run-directory group under ``runs_dir``."""
    runs_dir: str = "runs"
    """Where run directories go (``<runs_dir>/<name>/<job id>``); relative to the submit directory.
    On a cluster it must be on a filesystem every node sees."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


# --------------------------------------------------------------------------------------------------
# Generic dataclass <-> plain data
# --------------------------------------------------------------------------------------------------


def to_plain(obj: Any) -> Any:
    """Dataclasses, tuples and mappings as plain dicts/lists (for YAML and JSON)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _is_open_mapping(tp: Any) -> bool:
    tp, _ = _strip_optional(tp)
    return typing.get_origin(tp) in (collections.abc.Mapping, dict) or tp is dict


def _dataclass_type(tp: Any) -> type | None:
    tp, _ = _strip_optional(tp)
    return tp if dataclasses.is_dataclass(tp) else None


def valid_keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _describe(tp: Any) -> str:
    tp, optional = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        text = "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    elif tp is bool:
        text = "true or false"
    elif tp is int:
        text = "an integer"
    elif tp is float:
        text = "a number"
    elif tp is str:
        text = "a string"
    elif origin is tuple:
        text = "a list"
    elif _is_open_mapping(tp):
        text = "a mapping"
    elif dataclasses.is_dataclass(tp):
        text = "a mapping with keys " + ", ".join(valid_keys(tp))
    else:
        text = str(tp)
    return text + (" (or null)" if optional else "")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check/convert one YAML value against a field type; raise ConfigError naming ``path``."""
    inner, optional = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path}: must be {_describe(tp)}, got null")
    origin = typing.get_origin(inner)
    bad = ConfigError(f"{path}: must be {_describe(tp)}, got {value!r}")
    if dataclasses.is_dataclass(inner):
        if not isinstance(value, Mapping):
            raise bad
        return build(inner, value, path)
    if origin is Literal:
        if value not in typing.get_args(inner):
            raise bad
        return value
    if inner is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if inner is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if inner is str:
        # Numbers are accepted where text is expected (a YAML ``qos: 1`` means the string "1").
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise bad
        return str(value)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(inner)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise bad
        return tuple(_convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value))
    if _is_open_mapping(inner):
        if not isinstance(value, Mapping):
            raise bad
        key_tp, val_tp = typing.get_args(inner)
        out = {}
        for k, v in value.items():
            if val_tp is str:
                if isinstance(v, (dict, list)) or v is None:
                    raise ConfigError(f"{path}.{k}: must be a string, got {v!r}")
                v = str(v).lower() if isinstance(v, bool) else str(v)
            out[str(k)] = v
        return types.MappingProxyType(out)
    raise bad  # pragma: no cover - every field type is handled above


def build(cls: type, data: Mapping[str, Any], path: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with the list of valid ones."""
    hints = _hints(cls)
    names = valid_keys(cls)
    unknown = [k for k in data if k not in names]
    if unknown:
        raise _unknown_key("", path, str(unknown[0]), names)
    kwargs = {k: _convert(v, hints[k], _join(path, k)) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - all fields have defaults
        raise ConfigError(f"{path or 'job'}: {exc}") from None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown_key(source: str, path: str, key: str, names: Sequence[str]) -> ConfigError:
    """The one message for a key the schema does not have: where it came from, and the valid keys there."""
    where = f"under '{path}'" if path else "at the top level"
    prefix = f"{source}: " if source else ""
    return ConfigError(f"{prefix}unknown key {_join(path, key)!r}; valid keys {where}: {', '.join(names)}")


def check_keys(data: Mapping[str, Any], cls: type, source: str, path: str = "") -> None:
    """Reject unknown keys in one layer (job file, site file) before merging, naming the source."""
    names = valid_keys(cls)
    hints = _hints(cls)
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(source, path, str(key), names)
        sub = _dataclass_type(hints[key])
        if sub is not None and isinstance(value, Mapping):
            check_keys(value, sub, source, _join(path, key))


def check_dotted_key(dotted: str, cls: type = JobSpec) -> None:
    """Validate a ``--set`` path against the schema (open mappings such as ``slurm.env`` accept any subkey)."""
    parts = dotted.split(".")
    current: Any = cls
    walked = ""
    for i, part in enumerate(parts):
        names = valid_keys(current)
        if part not in names:
            raise _unknown_key(f"--set {dotted}", walked, part, names)
        tp = _hints(current)[part]
        walked = _join(walked, part)
        rest = parts[i + 1 :]
        if not rest:
            return
        if _is_open_mapping(tp):
            if len(rest) != 1:
                raise ConfigError(f"--set {dotted}: {walked} takes one more key, e.g. {walked}.NAME=value")
            return
        sub = _dataclass_type(tp)
        if sub is None:
            raise ConfigError(f"--set {dotted}: {walked} is {_describe(tp)}, it has no sub-keys")
        current = sub


# --------------------------------------------------------------------------------------------------
# Loading and layering
# --------------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 numbers: ``time: 1:30:00`` must stay the text "1:30:00",
    not the integer 5400."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
               r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def load_yaml_file(path: Path, what: str = "job file") -> dict[str, Any]:
    """Parse a YAML mapping; syntax errors name file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from None
    return parse_yaml_text(text, str(path), what)


def parse_yaml_text(text: str, source: str, what: str = "job file") -> dict[str, Any]:
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}; fix the {what}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a {what} must be a YAML mapping (key: value), got {type(data).__name__}")
    return data


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_set(item: str) -> tuple[str, Any]:
    """``dotted.key=value`` with the value read as a YAML scalar (``8`` → int, ``true`` → bool)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.epochs=10")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item!r}: empty key; expected KEY=VALUE")
    check_dotted_key(key)
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not valid YAML: take the text as it is
    return key, value


def dotted_to_nested(key: str, value: Any) -> dict[str, Any]:
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    return nested


# Site file: admin defaults. Same shape as a job file, plus where site templates live.
SITE_ENV = "HPC_TRAIN_SITE"


@dataclass(frozen=True)
class SiteConfig:
    path: Path | None
    defaults: dict[str, Any]
    template_dirs: tuple[Path, ...]


def site_file_candidates() -> list[Path]:
    if os.environ.get(SITE_ENV):
        return [Path(os.environ[SITE_ENV])]
    return [Path("/etc/hpc-train/site.yaml"), Path.home() / ".config/hpc-train/site.yaml"]


def load_site() -> SiteConfig:
    """Site defaults: ``$HPC_TRAIN_SITE`` alone if set, else ``/etc/hpc-train/site.yaml`` overlaid by
    ``~/.config/hpc-train/site.yaml`` (both optional)."""
    explicit = bool(os.environ.get(SITE_ENV))
    merged: dict[str, Any] = {}
    template_dirs: list[Path] = []
    used: Path | None = None
    for path in site_file_candidates():
        if not path.exists():
            if explicit:
                raise ConfigError(f"site file not found: {path} (from ${SITE_ENV}); fix or unset it")
            continue
        data = load_yaml_file(path, "site file")
        dirs = data.pop("template_dirs", []) or []
        if isinstance(dirs, str) or not isinstance(dirs, list):
            raise ConfigError(f"{path}: template_dirs must be a list of directories")
        template_dirs = [(path.parent / str(d)).expanduser() for d in dirs] + template_dirs
        check_keys(data, JobSpec, f"site file {path}")
        merged = deep_merge(merged, data)
        used = path
    return SiteConfig(path=used, defaults=merged, template_dirs=tuple(template_dirs))


def validate(spec: JobSpec) -> JobSpec:
    """Cross-field checks; messages say what to change."""
    s = spec.slurm
    if not spec.name or spec.name in (".", "..") or spec.name.startswith("-") or _NAME_FORBIDDEN.search(spec.name):
        raise ConfigError(
            f"name: {spec.name!r} cannot be a job name (it names a directory): no '/', newline or control "
            "characters, not empty, not starting with '-'"
        )
    for key in ("partition", "account", "qos", "constraint", "time", "gres_name"):
        value = getattr(s, key)
        if value is not None and ("\n" in value or "\r" in value):
            raise ConfigError(f"slurm.{key}: {value!r} contains a newline, which an #SBATCH line cannot carry")
    if s.nodes < 1:
        raise ConfigError(f"slurm.nodes must be at least 1, got {s.nodes}; use --nodes N with N >= 1")
    if s.gpus_per_node < 0:
        raise ConfigError(f"slurm.gpus_per_node must be 0 or more, got {s.gpus_per_node}")
    if s.tasks_per_node is not None and s.tasks_per_node < 1:
        raise ConfigError(f"slurm.tasks_per_node must be at least 1, got {s.tasks_per_node}")
    legacy_dp = spec.train.strategy == "dp" and s.ranks_per_node == 1 and s.nodes == 1
    if s.gpus_per_node > 0 and s.ranks_per_node != s.gpus_per_node and not legacy_dp:
        raise ConfigError(
            f"{s.ranks_per_node} ranks per node but {s.gpus_per_node} GPUs per node: hpc-train runs one rank "
            f"per GPU; leave --tasks-per-node unset or set it to {s.gpus_per_node} (train.strategy=dp: one task drives "
            "all GPUs of one node)"
        )
    if s.cpus_per_task < 1:
        raise ConfigError(f"slurm.cpus_per_task must be at least 1, got {s.cpus_per_task}")
    if s.mem_gb is not None and s.mem_gb < 0:
        raise ConfigError(f"slurm.mem_gb must be 0 (all memory) or more, got {s.mem_gb}")
    try:
        minutes = time_to_minutes(s.time)
    except ValueError:
        raise ConfigError(
            f"slurm.time: {s.time!r} is not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS (e.g. 02:00:00)"
        ) from None
    if minutes < 1:
        raise ConfigError(f"slurm.time: {s.time!r} is zero; give the job at least one minute")
    if s.signal_delay_s < 0 or s.signal_delay_s >= minutes * 60:
        raise ConfigError(
            f"slurm.signal_delay_s={s.signal_delay_s} must be >= 0 and shorter than the time limit ({s.time})"
        )
    if not re.fullmatch(r"[A-Z0-9]+", s.signal) or s.signal in ("KILL", "STOP", "9", "19"):
        raise ConfigError(f"slurm.signal: {s.signal!r} is not a catchable signal name; use USR2 or TERM")
    if s.max_requeues < 0:
        raise ConfigError(f"slurm.max_requeues must be 0 or more, got {s.max_requeues}")
    if s.container is not None and not s.container.image:
        raise ConfigError("slurm.container.image is empty; give an image or remove slurm.container")
    if s.venv and s.conda_env:
        raise ConfigError("set slurm.venv or slurm.conda_env, not both")
    for key in s.extra_sbatch:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise ConfigError(f"slurm.extra_sbatch: {key!r} is not an sbatch option name (e.g. mail-type)")
    for key in s.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"slurm.env: {key!r} is not a valid environment variable name")
    if not (1024 <= s.master_port_base and s.master_port_base + s.master_port_span <= 65535 and s.master_port_span > 0):
        raise ConfigError("slurm.master_port_base/span must keep ports within 1024-65535")
    t = spec.train
    _validate_train(t, s)
    return spec


def _validate_train(t: TrainConfig, s: SlurmConfig) -> None:
    """Training-side cross-field checks (the Literal fields are already checked by :func:`build`)."""
    d, loss = t.data, t.loss
    if t.epochs < 1:
        raise ConfigError(f"train.epochs must be at least 1, got {t.epochs}")
    if t.batch_size < 1:
        raise ConfigError(f"train.batch_size must be at least 1, got {t.batch_size}")
    if t.strategy == "ddp" and t.batch_size % s.world_size:
        raise ConfigError(
            f"train.batch_size={t.batch_size} does not split across {s.world_size} ranks; "
            f"use a multiple of {s.world_size}"
        )
    if t.strategy != "ddp" and s.world_size > 1:
        raise ConfigError(
            f"train.strategy={t.strategy} runs in one process but the job has {s.world_size} ranks; "
            "use strategy ddp or one task"
        )
    for name in ("eval_batch_size", "eval_every_epochs", "checkpoint_every_epochs", "keep_checkpoints",
                 "log_every_steps", "preempt_check_every_steps", "process_group_timeout_s"):
        if getattr(t, name) < 1:
            raise ConfigError(f"train.{name} must be at least 1, got {getattr(t, name)}")
    if t.checkpoint_every_s is not None and t.checkpoint_every_s <= 0:
        raise ConfigError(f"train.checkpoint_every_s must be > 0 (or unset), got {t.checkpoint_every_s}")
    if t.cuda_graphs is True:
        blocker = ("the device is the CPU" if t.device == "cpu" or (t.device == "auto" and s.gpus_per_node == 0)
                   else "amp fp16's gradient scaler is not captured" if t.amp == "fp16"
                   else "strategy dp runs DataParallel" if t.strategy == "dp"
                   else f"{d.name} streams batches from the host" if d.name in ("list", "imagefolder") else None)
        if blocker:
            raise ConfigError(f"train.cuda_graphs=on but {blocker}; use cuda_graphs auto or off")
    if t.num_threads is not None and t.num_threads < 1:
        raise ConfigError(f"train.num_threads must be at least 1 (or unset), got {t.num_threads}")
    if t.device == "cpu" or (t.device == "auto" and s.gpus_per_node == 0):
        if t.amp == "fp16":
            raise ConfigError("train.amp=fp16 needs CUDA (its gradient scaler is a GPU tool); use bf16 or off on CPU")
    if d.imbalance_factor < 1:
        raise ConfigError(f"train.data.imbalance_factor must be >= 1 (n_max/n_min), got {d.imbalance_factor}")
    if not 0 <= d.val_fraction < 1:
        raise ConfigError(f"train.data.val_fraction must be in [0, 1), got {d.val_fraction}")
    if d.num_workers < 0:
        raise ConfigError(f"train.data.num_workers must be 0 or more, got {d.num_workers}")
    if d.random_crop_padding is not None and d.random_crop_padding < 0:
        raise ConfigError(f"train.data.random_crop_padding must be 0 or more, got {d.random_crop_padding}")
    for name in ("num_classes", "max_per_class", "test_per_class", "image_size"):
        if getattr(d, name) < (2 if name == "num_classes" else 1):
            raise ConfigError(f"train.data.{name} is too small: {getattr(d, name)}")
    if d.name == "list" and not (d.train_list and d.test_list):
        raise ConfigError("train.data.name=list needs train.data.train_list and train.data.test_list "
                          "(files of 'relative/path label' lines)")
    if d.name != "list" and (d.train_list or d.val_list or d.test_list):
        raise ConfigError(f"train.data.train_list/val_list/test_list are for name=list, not {d.name}; remove them")
    if d.color_jitter < 0:
        raise ConfigError(f"train.data.color_jitter must be >= 0, got {d.color_jitter}")
    if not isinstance(t.sync_bn, bool) and t.sync_bn != "auto":
        raise ConfigError(f"train.sync_bn must be auto, true or false, got {t.sync_bn!r}")
    if d.stage_to and d.name != "list":
        raise ConfigError("train.data.stage_to copies list-file data sets only; remove it or use name=list")
    if loss.label_smoothing and loss.name != "ce":
        raise ConfigError(f"train.loss.label_smoothing applies to ce only, not {loss.name}; set it to 0")
    if not 0 <= loss.label_smoothing < 1:
        raise ConfigError(f"train.loss.label_smoothing must be in [0, 1), got {loss.label_smoothing}")
    if loss.focal_gamma < 0:
        raise ConfigError(f"train.loss.focal_gamma must be >= 0, got {loss.focal_gamma}")
    if loss.ldam_max_margin <= 0 or loss.ldam_scale <= 0:
        raise ConfigError("train.loss.ldam_max_margin and ldam_scale must be positive")
    if not 0 <= loss.cb_beta < 1:
        raise ConfigError(f"train.loss.cb_beta must be in [0, 1), got {loss.cb_beta}")
    if loss.drw_epoch is not None:
        if not 0 <= loss.drw_epoch < t.epochs:
            raise ConfigError(f"train.loss.drw_epoch={loss.drw_epoch} must be an epoch index in [0, {t.epochs})")
        if loss.reweight != "none":
            raise ConfigError("train.loss.drw_epoch defers re-weighting; it needs reweight: none (not both)")
    if t.model.classifier == "cosine" and loss.name != "ldam":
        raise ConfigError("train.model.classifier=cosine gives logits in [-1, 1] and is scaled by the LDAM loss "
                          "only; use loss ldam or classifier linear")
    if loss.name == "ldam" and t.model.classifier != "cosine":
        raise ConfigError("train.loss.name=ldam multiplies logits by ldam_scale, which presumes the cosine "
                          "classifier's logits in [-1, 1] (LDAM-DRW); set train.model.classifier=cosine")
    if t.sampler.per_class_draw < 1:
        raise ConfigError(f"train.sampler.per_class_draw must be at least 1, got {t.sampler.per_class_draw}")
    if t.sampler.progressive_epochs is not None and t.sampler.progressive_epochs < 1:
        raise ConfigError(f"train.sampler.progressive_epochs must be at least 1, got {t.sampler.progressive_epochs}")
    if t.optim.lr <= 0 or t.optim.base_batch_size < 1 or t.optim.weight_decay < 0:
        raise ConfigError("train.optim: lr must be > 0, base_batch_size >= 1 and weight_decay >= 0")
    sch = t.schedule
    if not 0 <= sch.warmup_epochs < t.epochs:
        raise ConfigError(f"train.schedule.warmup_epochs={sch.warmup_epochs} must be in [0, epochs={t.epochs})")
    if list(sch.milestones) != sorted(sch.milestones) or any(m < 0 for m in sch.milestones):
        raise ConfigError(f"train.schedule.milestones must be increasing epoch indices >= 0, got {list(sch.milestones)}")
    if sch.milestones and sch.name != "multistep":
        raise ConfigError(f"train.schedule.milestones are used by multistep only, not {sch.name}; remove them")
    ts = t.two_stage
    if ts.crt_epochs < 0 or ts.crt_lr <= 0:
        raise ConfigError("train.two_stage: crt_epochs must be >= 0 and crt_lr > 0")
    if ts.tau_norm and not (d.val_fraction > 0 or d.val_list):
        raise ConfigError("train.two_stage.tau_norm picks τ on a held-out split, never on test: set "
                          "train.data.val_fraction (e.g. 0.1) or train.data.val_list")


@dataclass(frozen=True, kw_only=True)
class JobSources:
    """Where a job's layers came from: useful in messages and recorded in the run directory."""

    job_file: Path | None
    site_file: Path | None
    template_dirs: tuple[Path, ...]


def default_job_path() -> Path:
    """The built-in default job (the digits demo), shipped in the package's ``jobs/``."""
    from .resources import jobs_dir

    return jobs_dir() / "digits_lt_demo.yaml"


def resolve_job(
    job_file: Path | None,
    *,
    sets: Sequence[str] = (),
    flags: Mapping[str, Any] | None = None,
    site: SiteConfig | None = None,
) -> tuple[JobSpec, JobSources]:
    """Layer built-in defaults < site < job file < --set < flags and return a validated JobSpec.

    ``flags`` are dotted keys (``slurm.nodes``) from explicit CLI options; ``None`` values are ignored.
    """
    site = load_site() if site is None else site
    path = job_file if job_file is not None else default_job_path()
    job_data = load_yaml_file(path)
    check_keys(job_data, JobSpec, f"job file {path}")
    merged = deep_merge(site.defaults, job_data)
    for item in sets:
        key, value = parse_set(item)
        merged = deep_merge(merged, dotted_to_nested(key, value))
    for key, value in (flags or {}).items():
        if value is not None:
            merged = deep_merge(merged, dotted_to_nested(key, value))
    # ``--gpus G`` alone means one rank per GPU, whatever tasks_per_node the job file had.
    if flags and flags.get("slurm.gpus_per_node") is not None and flags.get("slurm.tasks_per_node") is None:
        merged.setdefault("slurm", {})
        merged["slurm"] = {**merged["slurm"], "tasks_per_node": None}
    spec = validate(build(JobSpec, merged))
    return spec, JobSources(job_file=path, site_file=site.path, template_dirs=site.template_dirs)


def dump_yaml(spec: JobSpec) -> str:
    """The resolved job as YAML (what the plain sbatch script carries in its heredoc)."""
    return yaml.safe_dump(spec.to_dict(), sort_keys=False, default_flow_style=False, allow_unicode=True)


def spec_from_yaml_text(text: str, source: str) -> JobSpec:
    data = parse_yaml_text(text, source)
    check_keys(data, JobSpec, source)
    return validate(build(JobSpec, data))


def replace(spec: JobSpec, **changes: Any) -> JobSpec:
    return dataclasses.replace(spec, **changes)
