"""Checks of a built job; each message says what to change (ConfigError, exit 2).

The types are already checked by :mod:`hpc_train.config.typed`; single-field bounds are declared beside
their fields and checked first (:mod:`hpc_train.config.bounds`: 10^20 nodes, a negative learning rate).
Here are the rules between fields, the formats of single values (a Slurm time, a signal), and what must
never reach Slurm or the shell: ``%`` in names and paths (Slurm expands it in log paths), ``#SBATCH`` keys that
hpc-train writes itself, newlines on ``#SBATCH`` lines.
"""

from __future__ import annotations

import re
import typing

from ..errors import ConfigError
from . import bounds, slurm_options
from .job import JobSpec, SlurmConfig, time_to_minutes
from .plugins import is_import_path
from .training import PLUGIN_HINT, DatasetName, LossConfig, LossName, ModelName, TrainConfig

MAX_NAME_CHARS = 128
"""A job name is a directory name and a Slurm job name: short enough for both (NAME_MAX is 255 bytes)."""
MAX_COMMAND_CHARS = 100_000
MAX_TIME_MIN = 366 * 24 * 60
"""A year: longer is a typo (Slurm itself spells "no limit" INFINITE, which hpc-train does not ask for)."""

# A job name becomes a directory name and an #SBATCH value: anything printable except '/' and '%'
# (Slurm expands %j, %x, ... in the log paths built from it).
_NAME_FORBIDDEN = re.compile(r"[/%\x00-\x1f\x7f]")

MANAGED_SBATCH_KEYS = {**slurm_options.managed_sbatch_keys(JobSpec, ""),
                       **slurm_options.managed_sbatch_keys(SlurmConfig, "slurm"), **slurm_options.LAUNCH_SBATCH_KEYS}
"""#SBATCH keys the header writes from the job's own fields (declared on each field) and from the launch: a second
line in ``slurm.extra_sbatch`` would duplicate or contradict one."""

SBATCH_TEXT_FIELDS = slurm_options.sbatch_text_fields(SlurmConfig)
"""The slurm.* fields whose text lands on an #SBATCH line (declared on each field): a newline would end the line."""

SCRIPT_VARIABLE_PREFIX = "HT_"
"""The rendered script's own read-only variables (``HT_NAME``, ...; hpc_train/render/variables.py)."""


def validate(spec: JobSpec) -> JobSpec:
    """Bounds, then cross-field checks; messages say what to change."""
    bounds.check(spec.slurm, "slurm")
    if not spec.command:
        bounds.check(spec.train, "train")
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
    for key in SBATCH_TEXT_FIELDS:
        value = getattr(s, key)
        if isinstance(value, str) and ("\n" in value or "\r" in value):
            raise ConfigError(f"slurm.{key}: {value!r} contains a newline, which an #SBATCH line cannot carry")
    legacy_dp = strategy == "dp" and s.ranks_per_node == 1 and s.nodes == 1
    if s.gpus_per_node > 0 and s.ranks_per_node != s.gpus_per_node and not legacy_dp:
        raise ConfigError(
            f"{s.ranks_per_node} ranks per node but {s.gpus_per_node} GPUs per node: hpc-train runs one rank "
            f"per GPU; leave --tasks-per-node unset or set it to {s.gpus_per_node} (train.strategy=dp: one task drives "
            "all GPUs of one node)"
        )
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
    if s.pack > 1 and (s.nodes != 1 or s.ranks_per_node != 1 or s.launcher != "srun" or s.gpus_per_node > 1):
        raise ConfigError("slurm.pack runs several one-rank sweep points on one node (and at most one GPU): use "
                          "--nodes 1 --gpus 1 (or --gpus 0 --tasks-per-node 1) and the srun launcher")
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
        if key in SHELL_READS:
            raise ConfigError(f"slurm.env: {key} is read by every bash the job starts (its value expanded and run, or "
                              "the way the script is read changed); a job value never lands there: set it in your "
                              "own script")
        if (key in RANK_MAPPING or key.startswith(RANK_MAPPING_PREFIXES)) and key not in EXPORT_LISTS:
            raise ConfigError(f"slurm.env: {key} is a variable of the rank mapping, which the launcher sets for each "
                              "task (set there, every task would map itself to the same rank); remove it")
        if key.startswith(SCRIPT_VARIABLE_PREFIX):
            raise ConfigError(f"slurm.env: {key}: names starting {SCRIPT_VARIABLE_PREFIX} are the script's own "
                              "read-only variables; choose another name")
    if not (1024 <= s.master_port_base and s.master_port_base + s.master_port_span <= 65535 and s.master_port_span > 0):
        raise ConfigError("slurm.master_port_base/span must keep ports within 1024-65535")
    _validate_exports(s)


RANK_MAPPING = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                          "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
"""What :func:`hpc_train.rank.dist.DistEnv.from_environ` reads to tell a task who it is (torchrun's names)."""
RANK_MAPPING_PREFIXES = ("SLURM_", "MASTER_")
"""Slurm's own variables (the mapping's source under srun; the ``--export`` lists of :data:`EXPORT_LISTS` are
options, not the mapping, and stay allowed) and the rendezvous address."""


EXPORT_LISTS = frozenset({"SBATCH_EXPORT", "SLURM_EXPORT_ENV", "SRUN_EXPORT_ENV"})
"""Variables sbatch and srun read as their ``--export`` list (Slurm's sbatch(1) and srun(1), input environment)."""


def _validate_exports(s: SlurmConfig) -> None:
    """An ``--export`` list never sets a variable of :data:`SHELL_READS` either: sbatch and srun export it into
    every shell of the job (``--export=ALL,BASH_ENV=$(cmd)`` runs cmd in the torchrun launch line's bash)."""
    lists = [(f"slurm.env.{name}", value) for name, value in s.env.items() if name in EXPORT_LISTS]
    if isinstance(s.extra_sbatch.get("export"), str):
        lists.append(("slurm.extra_sbatch.export", s.extra_sbatch["export"]))
    for before, arg in zip(("", *s.srun_args), s.srun_args):
        if arg.startswith("--export=") or before == "--export":
            lists.append(("slurm.srun_args", arg.removeprefix("--export=")))
    for where, value in lists:
        for item in value.split(","):  # [ALL|NONE,]NAME[=VALUE],...: a comma inside a VALUE only adds names
            name = item.split("=", 1)[0].strip()
            if name in SHELL_READS:
                raise ConfigError(f"{where}: exports {name}, which every bash the job starts reads (its value "
                                  "expanded and run); a job value never lands there: set it in your own script")


SHELL_READS = frozenset({"BASH_ENV", "ENV", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS",
                         "IFS"})
"""Variables bash expands, runs or reads its script by: ``BASH_ENV='$(cmd)'`` runs cmd in every non-interactive
bash (the torchrun launch line's, a command that is a script), ``PS4`` under xtrace, ``IFS`` re-splits the
template's own words (docs/design.md, decision 3)."""


def _validate_train(t: TrainConfig, s: SlurmConfig) -> None:
    """Training-side cross-field checks (the Literal fields and the bounds are already checked)."""
    _validate_run(t, s)
    _validate_data(t)
    _validate_loss(t)
    _validate_methods(t)
    _validate_schedule(t)


def _validate_run(t: TrainConfig, s: SlurmConfig) -> None:
    """How the ranks run: the batch across them, the device, CUDA graphs."""
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
    on_cpu = t.device == "cpu" or (t.device == "auto" and s.gpus_per_node == 0)
    if t.cuda_graphs is True:
        blocker = ("the device is the CPU" if on_cpu
                   else "amp fp16's gradient scaler is not captured" if t.amp == "fp16"
                   else "strategy dp runs DataParallel" if t.strategy == "dp"
                   else f"{t.data.name} streams batches from the host" if t.data.name in ("list", "imagefolder")
                   else None)
        if blocker:
            raise ConfigError(f"train.cuda_graphs=on but {blocker}; use cuda_graphs auto or off")
    if on_cpu and t.amp == "fp16":
        raise ConfigError("train.amp=fp16 needs CUDA (its gradient scaler is a GPU tool); use bf16 or off on CPU")
    if not isinstance(t.sync_bn, bool) and t.sync_bn != "auto":
        raise ConfigError(f"train.sync_bn must be auto, true or false, got {t.sync_bn!r}")


def _validate_data(t: TrainConfig) -> None:
    d = t.data
    if d.name == "list" and not (d.train_list and d.test_list):
        raise ConfigError("train.data.name=list needs train.data.train_list and train.data.test_list "
                          "(files of 'relative/path label' lines)")
    if d.name != "list" and (d.train_list or d.val_list or d.test_list):
        raise ConfigError(f"train.data.train_list/val_list/test_list are for name=list, not {d.name}; remove them")
    if d.stage_to and d.name != "list":
        raise ConfigError("train.data.stage_to copies list-file data sets only; remove it or use name=list")


def _validate_loss(t: TrainConfig) -> None:
    _validate_loss_section(t.loss, "train.loss", t.model.classifier, t.epochs)
    loss = t.loss
    if loss.drw_epoch is not None and loss.reweight != "none":
        raise ConfigError("train.loss.drw_epoch defers re-weighting; it needs reweight: none (not both)")
    if t.model.classifier == "cosine" and loss.name != "ldam" and not is_import_path(loss.name):
        raise ConfigError("train.model.classifier=cosine gives logits in [-1, 1] and is scaled by the LDAM loss "
                          "only; use loss ldam or classifier linear")


def _validate_loss_section(loss: LossConfig, key: str, classifier: str, epochs: int) -> None:
    """The rules of one loss section (``train.loss``, ``train.two_stage.crt_loss``)."""
    builtin = typing.get_args(LossName)
    if loss.name not in builtin and not is_import_path(loss.name):
        raise ConfigError(f"{key}.name: must be one of {', '.join(map(repr, builtin))} {PLUGIN_HINT}, "
                          f"got {loss.name!r}")
    if loss.args and loss.name in builtin:
        raise ConfigError(f"{key}.args: are for plug-ins; {loss.name} takes its settings from {key}.* keys")
    if loss.label_smoothing and loss.name != "ce":
        raise ConfigError(f"{key}.label_smoothing applies to ce only, not {loss.name}; set it to 0")
    if loss.drw_epoch is not None:
        if not 0 <= loss.drw_epoch < epochs:
            raise ConfigError(f"{key}.drw_epoch={loss.drw_epoch} must be an epoch index in [0, {epochs})")
        if loss.reweight != "none":
            raise ConfigError(f"{key}.drw_epoch defers re-weighting; it needs reweight: none (not both)")
    if loss.name == "ldam" and classifier != "cosine":
        raise ConfigError(f"{key}.name=ldam multiplies logits by ldam_scale, which presumes the cosine "
                          "classifier's logits in [-1, 1] (LDAM-DRW); set train.model.classifier=cosine")
    if loss.name == "label_aware_smoothing" and loss.smooth_head < loss.smooth_tail:
        # MiSLAS smooths the head more than the tail; the other order is a typo, not a recipe.
        raise ConfigError(f"{key}.smooth_head={loss.smooth_head} is below smooth_tail={loss.smooth_tail}; "
                          "label-aware smoothing smooths frequent classes more (MiSLAS: 0.4 / 0.1)")


def _validate_methods(t: TrainConfig) -> None:
    """SAM, mixup and the stage-2 keys: only where they apply."""
    o, two = t.optim, t.two_stage
    if o.sam_tail_below and not o.sam_rho:
        raise ConfigError("train.optim.sam_tail_below chooses ImbSAM's tail classes for SAM; set train.optim.sam_rho "
                          "too (ImbSAM: 0.05)")
    if t.mixup_alpha and t.data.name in ("list", "imagefolder"):
        raise ConfigError(f"train.mixup_alpha mixes images of the in-memory data sets (CIFAR, digits, synthetic); "
                          f"{t.data.name} streams its batches from disk: set it to 0")
    if t.mixup_alpha and o.sam_tail_below:
        raise ConfigError("train.optim.sam_tail_below splits the batch by its targets' classes, which mixup "
                          "blends; use one of them")
    if o.sam_rho and t.amp == "fp16":
        raise ConfigError("train.optim.sam_rho with amp fp16: the gradient scaler takes one backward pass per step, "
                          "SAM takes two; use amp bf16 or off")
    if (o.sam_rho or t.mixup_alpha) and t.strategy == "dp":
        raise ConfigError("train.optim.sam_rho and train.mixup_alpha need strategy ddp or none (not dp)")
    staged = {"crt_max_norm": two.crt_max_norm is not None, "crt_weight_decay": two.crt_weight_decay is not None,
              "crt_reinit": not two.crt_reinit, "crt_loss": two.crt_loss != LossConfig()}
    for name, set_here in staged.items():
        if set_here and not two.crt_epochs:
            raise ConfigError(f"train.two_stage.{name} applies to stage 2; set train.two_stage.crt_epochs (or remove "
                              "it)")
    if two.crt_epochs:
        _validate_loss_section(two.crt_loss, "train.two_stage.crt_loss", t.model.classifier, two.crt_epochs)
        if two.crt_loss.posthoc_tau is not None:
            raise ConfigError("train.two_stage.crt_loss.posthoc_tau: post-hoc adjustment is evaluated from "
                              "train.loss.posthoc_tau; remove it here")
        if two.crt_loss.drw_epoch is not None:
            raise ConfigError("train.two_stage.crt_loss.drw_epoch: stage 2 has no deferred re-weighting; use "
                              "reweight: class_balanced")
    if two.crt_max_norm is not None and t.model.classifier != "linear":
        raise ConfigError("train.two_stage.crt_max_norm caps the norms of a linear classifier's class vectors; the "
                          "cosine classifier's are normalised anyway: use classifier linear")


def _validate_schedule(t: TrainConfig) -> None:
    sch = t.schedule
    if sch.warmup_epochs >= t.epochs:
        raise ConfigError(f"train.schedule.warmup_epochs={sch.warmup_epochs} must be in [0, epochs={t.epochs}); to "
                          "shorten a recipe use --epochs N, which scales its warm-up and milestones with it")
    if list(sch.milestones) != sorted(sch.milestones) or any(m < 0 for m in sch.milestones):
        raise ConfigError(f"train.schedule.milestones must be increasing epoch indices >= 0, got {list(sch.milestones)}")
    if sch.milestones and sch.name != "multistep":
        raise ConfigError(f"train.schedule.milestones are used by multistep only, not {sch.name}; remove them")
    if t.two_stage.tau_norm and not (t.data.val_fraction > 0 or t.data.val_list):
        raise ConfigError("train.two_stage.tau_norm picks τ on a held-out split, never on test: set "
                          "train.data.val_fraction (e.g. 0.1) or train.data.val_list")
