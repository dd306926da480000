"""A Slurm option declared once, on its field: ``nodes: int = option(1, sbatch=Sbatch("nodes"), flag=Flag(...))``.

What a field says about itself here is all anyone needs: the ``#SBATCH`` line it writes and the keys that line
manages (so ``slurm.extra_sbatch`` cannot write them twice), whether a local run honours it, and its command-line
flag. Every list that used to be typed by hand is derived from the fields (:func:`sbatch_options`,
:func:`managed_sbatch_keys`, :func:`sbatch_text_fields`, :func:`ignored_locally`, :func:`cli_flags`), so adding an
option is one edit, on its field. Torch-free and click-free (the CLI turns :class:`Flag` into a click option).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .bounds import Bounds

SBATCH = "sbatch"
LOCAL = "local"
FLAG = "flag"


@dataclass(frozen=True)
class Sbatch:
    """The ``#SBATCH`` line a field writes. ``key``: ``--key=value`` with the field's value (None: no line); ``flag``:
    a bare ``--key`` while the value is true; ``value``: the value from the whole section, where it is not the field's
    own (``--ntasks-per-node`` counts the launcher too), or ``write``: the whole ``--key=value`` text (None: no line),
    where the key itself depends on other fields. ``manages``: the keys the line sets (``key`` when not given);
    ``reads``: the other fields whose text lands on the line (each checked for a newline); ``advice``: (key, words) the
    refusal of that key in ``slurm.extra_sbatch`` adds to the field's name (``gres``: "with slurm.gpu_flag=gres")."""

    key: str | None = None
    flag: bool = False
    value: Callable[[Any], Any] | None = None
    write: Callable[[Any], str | None] | None = None
    unit: str = ""
    manages: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    advice: tuple[tuple[str, str], ...] = ()

    def keys(self) -> tuple[str, ...]:
        return self.manages or ((self.key,) if self.key else ())


@dataclass(frozen=True)
class Flag:
    """The command-line option that sets a field (``--nodes/-N``, ``$HPC_TRAIN_NODES``)."""

    name: str
    short: str | None = None
    envvar: str | None = None
    help: str = ""
    metavar: str | None = None
    group: str = "job"
    """Which shared option set lists it (``job``: every job command; ``sweep``: beside --sweep)."""


def option(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
           sbatch: Sbatch | None = None, local: bool | str = True, flag: Flag | None = None,
           bounds: Bounds | None = None) -> Any:
    """A dataclass field with what it says about itself. ``local``: True (a local run honours it), False (it means
    something on a cluster only), or ``"requeue"`` (honoured locally only where a local run relaunches: a command, or
    ``hang_action: requeue``)."""
    metadata: dict[str, Any] = {LOCAL: local}
    if sbatch is not None:
        metadata[SBATCH] = sbatch
    if flag is not None:
        metadata[FLAG] = flag
    if bounds is not None:
        metadata["bounds"] = bounds
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def _fields(section: type) -> Iterator[dataclasses.Field]:
    return iter(dataclasses.fields(section))


def sbatch_options(section: type) -> list[tuple[str, Sbatch]]:
    """(field name, its ``#SBATCH`` declaration), in field order: the header's order."""
    return [(f.name, f.metadata[SBATCH]) for f in _fields(section) if SBATCH in f.metadata]


def sbatch_text(name: str, declared: Sbatch, section: Any) -> str | None:
    """The ``--key[=value]`` a field writes for ``section`` (unquoted: the header quotes it), or None."""
    if declared.write is not None:
        return declared.write(section)
    value = declared.value(section) if declared.value is not None else getattr(section, name)
    if declared.flag:
        return f"--{declared.key}" if value else None
    if value is None:
        return None
    return f"--{declared.key}={value}{declared.unit}"


def managed_sbatch_keys(section: type, path: str) -> dict[str, str]:
    """Each ``#SBATCH`` key a field writes, with what sets it (``slurm.nodes (--nodes)``)."""
    managed: dict[str, str] = {}
    for f in _fields(section):
        declared = f.metadata.get(SBATCH)
        if declared is None:
            continue
        flag: Flag | None = f.metadata.get(FLAG)
        setting = f"{path}.{f.name}" if path else f.name
        if flag is not None:
            setting += f" ({flag.name})"
        advice = dict(declared.advice)
        for key in declared.keys():
            managed.setdefault(key, f"{setting} {advice[key]}" if key in advice else setting)
    return managed


def sbatch_text_fields(section: type) -> tuple[str, ...]:
    """The fields whose text lands on an ``#SBATCH`` line (a newline in one would end the line)."""
    names: list[str] = []
    for name, declared in sbatch_options(section):
        for read in (name, *declared.reads):
            if read not in names:
                names.append(read)
    return tuple(names)


def ignored_locally(section: Any, *, relaunches: bool) -> list[str]:
    """The fields of ``section`` set away from their defaults that a local run cannot honour (``relaunches``: the
    local run launches again, so the requeue settings apply)."""
    default = type(section)()
    ignored = []
    for f in _fields(type(section)):
        local = f.metadata.get(LOCAL, True)
        if local is False or (local == "requeue" and not relaunches):
            if getattr(section, f.name) != getattr(default, f.name):
                ignored.append(f.name)
    return ignored


def local_only_names(section: type) -> tuple[str, ...]:
    """Every field a local run may ignore (``local`` False or ``"requeue"``)."""
    return tuple(f.name for f in _fields(section) if f.metadata.get(LOCAL, True) is not True)


def cli_flags(section: type, path: str = "") -> list[tuple[str, dataclasses.Field, Flag]]:
    """(dotted job key, field, flag) for every field of ``section`` with a command-line flag, in field order."""
    return [(f"{path}.{f.name}" if path else f.name, f, f.metadata[FLAG]) for f in _fields(section)
            if FLAG in f.metadata]


LAUNCH_SBATCH_KEYS = {
    "output": "nothing: hpc-train places the logs (see `hpc-train logs`)",
    "error": "nothing: hpc-train places the logs (see `hpc-train logs`)",
    "open-mode": "nothing: logs are appended across requeues",
    "array": "--sweep / --sweep-file (and --max-parallel)",
    "wrap": "nothing: hpc-train renders a whole script (--wrap cannot apply)",
    "chdir": "nothing: hpc-train runs from the submit directory (runs_dir may be absolute)",
}
"""``#SBATCH`` keys no field owns: the header writes the launch's log paths and array itself, and two keys cannot
apply to a rendered script at all. With every field's keys (:func:`managed_sbatch_keys`), what
``slurm.extra_sbatch`` may not write."""
