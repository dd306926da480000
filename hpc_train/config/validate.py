"""Cross-field checks of a built job; each message says what to change (ConfigError, exit 2).

The types are already checked by :mod:`hpc_train.config.typed`; here are the rules between fields, the
limits that keep absurd values out (10^20 nodes, a 300-character name), and what must never reach
Slurm or the shell: ``%`` in names and paths (Slurm expands it in log paths), ``#SBATCH`` keys that
hpc-train writes itself, newlines on ``#SBATCH`` lines.
"""

from __future__ import annotations

import re
import typing

from ..errors import ConfigError
from .job import JobSpec, SlurmConfig, time_to_minutes
from .plugins import is_import_path
from .training import PLUGIN_HINT, DatasetName, LossName, ModelName, TrainConfig

MAX_NAME_CHARS = 128
"""A job name is a directory name and a Slurm job name: short enough for both (NAME_MAX is 255 bytes)."""
MAX_NODES = 100_000
MAX_RANKS_PER_NODE = 1024
MAX_PACK = 64
"""Sweep points in one allocation: more is a typo, not a plan (a GPU time-slices beyond a few)."""
MAX_COMMAND_CHARS = 100_000
MAX_TIME_MIN = 366 * 24 * 60
"""A year: longer is a typo (Slurm itself spells "no limit" INFINITE, which hpc-train does not ask for)."""

# A job name becomes a directory name and an #SBATCH value: anything printable except '/' and '%'
# (Slurm expands %j, %x, ... in the log paths built from it).
_NAME_FORBIDDEN = re.compile(r"[/%\x00-\x1f\x7f]")

# #SBATCH keys the template writes from the job's own fields: a second line would duplicate or contradict.
MANAGED_SBATCH_KEYS = {
    "nodes": "slurm.nodes (--nodes)",
    "ntasks": "slurm.tasks_per_node (--tasks-per-node)",
    "ntasks-per-node": "slurm.tasks_per_node (--tasks-per-node)",
    "cpus-per-task": "slurm.cpus_per_task",
    "gpus": "slurm.gpus_per_node (--gpus)",
    "gpus-per-node": "slurm.gpus_per_node (--gpus)",
    "gpus-per-task": "slurm.gpus_per_node (--gpus: one rank per GPU)",
    "gres": "slurm.gpus_per_node (--gpus) with slurm.gpu_flag=gres and slurm.gres_name",
    "mem": "slurm.mem_gb",
    "mem-per-cpu": "slurm.mem_gb",
    "mem-per-gpu": "slurm.mem_gb",
    "time": "slurm.time (--time)",
    "partition": "slurm.partition (--partition)",
    "account": "slurm.account (--account)",
    "qos": "slurm.qos",
    "constraint": "slurm.constraint",
    "exclusive": "slurm.exclusive",
    "job-name": "name (--name)",
    "output": "nothing: hpc-train places the logs (see `hpc-train logs`)",
    "error": "nothing: hpc-train places the logs (see `hpc-train logs`)",
    "open-mode": "nothing: logs are appended across requeues",
    "signal": "slurm.signal and slurm.signal_delay_s",
    "requeue": "slurm.requeue",
    "no-requeue": "slurm.requeue",
    "array": "--sweep / --sweep-file (and --max-parallel)",
    "wrap": "nothing: hpc-train renders a whole script (--wrap cannot apply)",
    "chdir": "nothing: hpc-train runs from the submit directory (runs_dir may be absolute)",
}


def validate(spec: JobSpec) -> JobSpec:
    """Cross-field checks; messages say what to change."""
    _validate_name_and_paths(spec)
    _validate_slurm(spec.slurm, spec.train.strategy)
    if spec.command:
        _validate_command(spec)
    else:  # a command job does not run the trainer: its train: section is not used, nor checked
        _validate_names(spec.train)
        _validate_train(spec.train, spec.slurm)
    return spec


def _validate_command(spec: JobSpec) -> None:
    if not spec.command[0]:
        raise ConfigError("command: the program (its first word) is empty")
    if sum(len(word) for word in spec.command) > MAX_COMMAND_CHARS:
        raise ConfigError(f"command: longer than {MAX_COMMAND_CHARS:,} characters; put the arguments in a file")
    if spec.slurm.pack > 1:
        raise ConfigError("slurm.pack packs sweep points of the trainer; a command runs alone (use pack 1)")


def _validate_names(t: TrainConfig) -> None:
    """Built-in names or plug-in import paths; a plug-in's args only with a plug-in."""
    for key, section, names in (("data", t.data, DatasetName), ("model", t.model, ModelName),
                                ("loss", t.loss, LossName)):
        builtin = typing.get_args(names)
        if section.name not in builtin and not is_import_path(section.name):
            raise ConfigError(f"train.{key}.name: must be one of {', '.join(map(repr, builtin))} {PLUGIN_HINT}, "
                              f"got {section.name!r}")
        if section.args and section.name in builtin:
            raise ConfigError(f"train.{key}.args: are for plug-ins; {section.name} takes its settings from "
                              f"train.{key}.* keys")


def _validate_name_and_paths(spec: JobSpec) -> None:
    name = spec.name
    if not name or name in (".", "..") or name.startswith("-") or _NAME_FORBIDDEN.search(name):
        raise ConfigError(
            f"name: {name!r} cannot be a job name (it names a directory): no '/', '%', newline or control "
            "characters, not empty, not starting with '-'"
        )
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(f"name: {len(name)} characters; a job name has at most {MAX_NAME_CHARS} (it names a "
                          "directory and the Slurm job)")
    if not spec.runs_dir or re.search(r"[%\x00-\x1f\x7f]", spec.runs_dir):
        raise ConfigError(f"runs_dir: {spec.runs_dir!r} cannot hold '%' (Slurm expands it in log paths), a newline "
                          "or control characters, and cannot be empty; choose another directory")


def _validate_slurm(s: SlurmConfig, strategy: str) -> None:
    for key in ("partition", "account", "qos", "constraint", "time", "gres_name"):
        value = getattr(s, key)
        if value is not None and ("\n" in value or "\r" in value):
            raise ConfigError(f"slurm.{key}: {value!r} contains a newline, which an #SBATCH line cannot carry")
    if not 1 <= s.nodes <= MAX_NODES:
        raise ConfigError(f"slurm.nodes must be between 1 and {MAX_NODES:,}, got {s.nodes}; use --nodes N")
    if not 0 <= s.gpus_per_node <= MAX_RANKS_PER_NODE:
        raise ConfigError(f"slurm.gpus_per_node must be between 0 and {MAX_RANKS_PER_NODE}, got {s.gpus_per_node}")
    if s.tasks_per_node is not None and not 1 <= s.tasks_per_node <= MAX_RANKS_PER_NODE:
        raise ConfigError(f"slurm.tasks_per_node must be between 1 and {MAX_RANKS_PER_NODE}, got {s.tasks_per_node}")
    legacy_dp = strategy == "dp" and s.ranks_per_node == 1 and s.nodes == 1
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
    if minutes > MAX_TIME_MIN:
        raise ConfigError(f"slurm.time: {s.time!r} is more than a year; give a Slurm time limit the site allows")
    if s.signal_delay_s < 0 or s.signal_delay_s >= minutes * 60:
        raise ConfigError(
            f"slurm.signal_delay_s={s.signal_delay_s} must be >= 0 and shorter than the time limit ({s.time})"
        )
    if not re.fullmatch(r"[A-Z0-9]+", s.signal) or s.signal in ("KILL", "STOP", "9", "19"):
        raise ConfigError(f"slurm.signal: {s.signal!r} is not a catchable signal name; use USR2 or TERM")
    if not 1 <= s.pack <= MAX_PACK:
        raise ConfigError(f"slurm.pack must be between 1 and {MAX_PACK}, got {s.pack}")
    if s.pack > 1 and (s.nodes != 1 or s.ranks_per_node != 1 or s.launcher != "srun" or s.gpus_per_node > 1):
        raise ConfigError("slurm.pack runs several one-rank sweep points on one node (and at most one GPU): use "
                          "--nodes 1 --gpus 1 (or --gpus 0 --tasks-per-node 1) and the srun launcher")
    if s.max_requeues < 0:
        raise ConfigError(f"slurm.max_requeues must be 0 or more, got {s.max_requeues}")
    if s.container is not None and not s.container.image:
        raise ConfigError("slurm.container.image is empty; give an image or remove slurm.container")
    if s.venv and s.conda_env:
        raise ConfigError("set slurm.venv or slurm.conda_env, not both")
    for key in s.extra_sbatch:
        if not re.fullmatch(r"[a-z][a-z0-9-]+", key):
            raise ConfigError(f"slurm.extra_sbatch: {key!r} is not a long sbatch option name (e.g. mail-type)")
        if key in MANAGED_SBATCH_KEYS:
            raise ConfigError(f"slurm.extra_sbatch: {key!r} is written by hpc-train itself; use "
                              f"{MANAGED_SBATCH_KEYS[key]} instead")
    for key in s.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"slurm.env: {key!r} is not a valid environment variable name")
    if not (1024 <= s.master_port_base and s.master_port_base + s.master_port_span <= 65535 and s.master_port_span > 0):
        raise ConfigError("slurm.master_port_base/span must keep ports within 1024-65535")


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
    if t.model.classifier == "cosine" and loss.name != "ldam" and not is_import_path(loss.name):
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

