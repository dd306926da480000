"""Layering: built-in defaults < site file < job file < ``--set key=value`` < explicit CLI flags, and the
one :func:`resolve` every command calls (with or without a sweep).

Each layer is checked for unknown keys on its own (the message names the file or the ``--set``), the
layers are merged key by key (mappings merge, anything else is replaced), and the result is built into
a frozen :class:`~hpc_train.config.job.JobSpec` by the schema and validated.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ..errors import ConfigError
from .epochs import describe, rescale
from .job import JobSpec
from .sweep import Point, apply_point, sweep_points
from .typed import build, check_keys, field_type, plain_value
from .validate import validate
from .yaml_text import Scalar, load_yaml_file, parse_mapping, parse_value

SITE_ENV = "HPC_TRAIN_SITE"


@dataclass(frozen=True)
class SiteConfig:
    """Admin defaults: same keys as a job file, plus where site templates live."""

    path: Path | None
    defaults: dict[str, Any]
    template_dirs: tuple[Path, ...]


NO_SITE = SiteConfig(path=None, defaults={}, template_dirs=())


@dataclass(frozen=True, kw_only=True)
class JobSources:
    """Where a job's layers came from: useful in messages and recorded in the run directory."""

    job_file: Path | None
    site_file: Path | None
    template_dirs: tuple[Path, ...]


@dataclass(frozen=True)
class Resolved:
    """What a command works on: the job (the first point of a sweep), where it came from, and the sweep."""

    spec: JobSpec
    sources: JobSources
    sweep: tuple[JobSpec, ...] = ()
    epochs_change: str = ""
    """What ``epochs=N`` rescaled, one line for stderr (empty without it)."""


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
        if not isinstance(dirs, list) or not all(isinstance(d, Scalar) for d in dirs):
            raise ConfigError(f"{path}: template_dirs must be a list of directories")
        template_dirs = [_template_dir(path, d) for d in dirs] + template_dirs
        check_keys(data, JobSpec, f"site file {path}")
        merged = deep_merge(merged, data)
        used = path
    return SiteConfig(path=used, defaults=merged, template_dirs=tuple(template_dirs))


def _template_dir(site_file: Path, entry: Scalar) -> Path:
    """A ``template_dirs`` entry (``~`` expanded; relative to the site file): a directory, or the site file is
    refused (a missing one would silently leave the site's templates out)."""
    directory = Path(entry.text).expanduser()
    directory = directory if directory.is_absolute() else site_file.parent / directory
    if not directory.is_dir():
        why = "does not exist" if not directory.exists() else "is not a directory"
        raise ConfigError(f"{entry.where or site_file}: template_dirs entry {entry.text!r} ({directory}) {why}; "
                          "create it (hpc-train templates export DIR) or remove it from the site file")
    return directory


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def dotted_to_nested(key: str, value: Any) -> dict[str, Any]:
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    return nested


def parse_set(item: str) -> tuple[str, Any]:
    """``dotted.key=VALUE``: the key checked against the schema, the value kept as written (the field's
    type reads it when the job is built: ``--set train.amp=off`` is the text "off")."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.epochs=10")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item!r}: empty key; expected KEY=VALUE")
    field_type(key, JobSpec, f"--set {key}")
    return key, parse_value(raw, f"--set {key}")


def default_job_path() -> Path:
    """The built-in default job (the digits demo), shipped in the package's ``jobs/``."""
    from ..resources import jobs_dir

    return jobs_dir() / "digits_lt_demo.yaml"


def job_path(job: str | Path | None) -> Path | None:
    """A job file path, or the name of a shipped example job (``cifar10_lt_ldam_drw``); None: the default."""
    if job is None or isinstance(job, Path):
        return job
    path = Path(job)
    if path.exists() or "/" in job or job.endswith((".yaml", ".yml")):
        return path
    from ..resources import jobs_dir

    for candidate in (jobs_dir() / f"{job}.yaml", jobs_dir() / job):
        if candidate.is_file():
            return candidate
    return path  # not found: reading it says "job file not found" with the path


def _layered(path: Path, sets: Sequence[str], flags: Mapping[str, Any] | None, site: SiteConfig) -> dict[str, Any]:
    job_data = load_yaml_file(path)
    if not job_data:  # never the default job under another's name: an empty file is a mistake
        raise ConfigError(f"job file {path} is empty; give at least its name and train: (or slurm:) keys, e.g. "
                          "from `hpc-train jobs show digits_lt_demo`, or give no JOB for the default job")
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
        merged["slurm"] = {**merged.get("slurm", {}), "tasks_per_node": None}
    return merged


def resolve(job: str | Path | None = None, *, sets: Sequence[str] = (), flags: Mapping[str, Any] | None = None,
            sweeps: Sequence[str] = (), sweep_file: Path | None = None, site: SiteConfig | None = None,
            epochs: int | None = None) -> Resolved:
    """The job a command works on. ``job``: a path, a shipped example's name, or None (the default job);
    ``flags``: dotted keys (``slurm.nodes``) from explicit CLI options, ``None`` values ignored;
    ``sweeps``/``sweep_file``: one validated job per point (train.* keys only); ``epochs``: ``--epochs N``,
    the recipe rescaled to N epochs (:mod:`.epochs`; every command that takes the flag comes here)."""
    site = load_site() if site is None else site
    path = job_path(job) or default_job_path()
    merged = _layered(path, sets, flags, site)
    sources = JobSources(job_file=path, site_file=site.path, template_dirs=site.template_dirs)
    points: list[Point] = sweep_points(sweeps, sweep_file)
    specs = tuple(validate(build(JobSpec, apply_point(merged, point))) for point in points)
    if specs and specs[0].command:
        raise ConfigError("a sweep varies train.* keys of the shared trainer; a job with a command runs it as "
                          "written: submit one job per variant (or read the variant from your own arguments)")
    spec = specs[0] if specs else validate(build(JobSpec, merged))
    if epochs is None:
        return Resolved(spec, sources, specs)
    spec, changes = rescale(spec, epochs)
    specs = tuple(rescale(point, epochs)[0] for point in specs)
    return Resolved(specs[0] if specs else spec, sources, specs, describe(epochs, changes))


def resolve_job(job_file: Path | None, *, sets: Sequence[str] = (), flags: Mapping[str, Any] | None = None,
                site: SiteConfig | None = None) -> tuple[JobSpec, JobSources]:
    """:func:`resolve` without a sweep, as (spec, sources)."""
    resolved = resolve(job_file, sets=sets, flags=flags, site=site)
    return resolved.spec, resolved.sources


class _Dumper(yaml.SafeDumper):
    """Quotes every text that an open field (a plug-in's ``args``) would read back as something else
    (``"1e5"``: YAML 1.1 writes it plain, :func:`~.typed.plain_value` would read a number)."""


def _represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    try:
        retyped = not isinstance(plain_value(Scalar(text), ""), str)
    except ConfigError:
        retyped = False
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="'" if retyped else None)


_Dumper.add_representer(str, _represent_text)


def dump_yaml(spec: JobSpec) -> str:
    """The resolved job as YAML (what the plain sbatch script carries in HT_JOB_YAML; reading it back gives
    the same job, since every text value is read as written)."""
    return yaml.dump(spec.to_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def spec_from_yaml_text(text: str, source: str) -> JobSpec:
    """A fully resolved job (``job.yaml`` / ``config.json`` of a run directory): no layering."""
    data = parse_mapping(text, source)
    check_keys(data, JobSpec, source)
    return validate(build(JobSpec, data))


def replace(spec: JobSpec, **changes: Any) -> JobSpec:
    return dataclasses.replace(spec, **changes)
