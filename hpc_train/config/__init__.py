"""Job configuration: typed, frozen dataclasses read from YAML as written, layered, validated.

One job per module:

* :mod:`.job` — the job, its ``slurm:`` section (``JobSpec``, ``SlurmConfig``);
* :mod:`.training` — the ``train:`` section (every train dataclass, together);
* :mod:`.yaml_text` — reading files as data: raw values as written, duplicate keys and tags refused,
  only small regular files;
* :mod:`.typed` — the schema at work: raw values to the types the fields declare, unknown keys refused;
* :mod:`.validate` — cross-field checks and limits;
* :mod:`.sweep` — sweep grids and files as typed points;
* :mod:`.layers` — built-in defaults < site file < job file < ``--set`` < flags, and :func:`resolve`,
  the one entry the CLI calls.

Everything here is torch-free and click-free; errors are :class:`~hpc_train.errors.ConfigError` (exit 2).
"""

from ..errors import ConfigError
from .job import ContainerConfig, ContainerRuntime, GpuFlag, JobSpec, Launcher, SlurmConfig, time_to_minutes
from .layers import (
    NO_SITE,
    SITE_ENV,
    JobSources,
    Resolved,
    SiteConfig,
    deep_merge,
    default_job_path,
    dotted_to_nested,
    dump_yaml,
    job_path,
    load_site,
    parse_set,
    replace,
    resolve,
    resolve_job,
    site_file_candidates,
    spec_from_yaml_text,
)
from .sweep import MAX_POINTS, apply_point, sweep_points
from .training import (
    DataConfig,
    DatasetName,
    LossConfig,
    LossName,
    ModelConfig,
    ModelName,
    OptimConfig,
    SamplerConfig,
    SamplerName,
    ScheduleConfig,
    TrainConfig,
    TwoStageConfig,
)
from .typed import build, check_keys, convert, field_type, to_plain, valid_keys
from .validate import validate
from .yaml_text import Scalar, load_yaml_file, parse_mapping, parse_value, parse_yaml, read_text_file

__all__ = [
    "ConfigError", "ContainerConfig", "ContainerRuntime", "DataConfig", "DatasetName", "GpuFlag", "JobSources",
    "JobSpec", "Launcher", "LossConfig", "LossName", "MAX_POINTS", "ModelConfig", "ModelName", "NO_SITE",
    "OptimConfig", "Resolved", "SITE_ENV", "SamplerConfig", "SamplerName", "Scalar", "ScheduleConfig", "SiteConfig",
    "SlurmConfig", "TrainConfig", "TwoStageConfig", "apply_point", "build", "check_keys", "convert", "deep_merge",
    "default_job_path", "dotted_to_nested", "dump_yaml", "field_type", "job_path", "load_site", "load_yaml_file",
    "parse_mapping", "parse_set", "parse_value", "parse_yaml", "read_text_file", "replace", "resolve",
    "resolve_job", "site_file_candidates", "spec_from_yaml_text", "sweep_points", "time_to_minutes", "to_plain",
    "valid_keys", "validate",
]
