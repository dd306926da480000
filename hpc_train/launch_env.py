"""The numbers a launcher hands a rank through its environment (Slurm's, torchrun's, the local launcher's), read
one way: an integer in its range, or exit 2 naming the variable (issue 28, item 5). A rank that read
``SLURM_RESTART_COUNT=x`` used to die in a traceback; one that read ``MASTER_PORT=70000`` waited for a rendezvous
that could never happen. Torch-free and stdlib-only: the ranks, the run directory and the watchdogs import it."""

from __future__ import annotations

import re
from typing import Mapping

from .errors import ConfigError

MAX_RESTARTS = 1_000_000
"""No launch is requeued this often; a larger count is a broken environment, not a long run."""

_JOB_ID = re.compile(r"[0-9]{1,19}(?:_[0-9]{1,9})?")
"""A Slurm job id, or an array task's ``<array id>_<task>``."""


class LaunchEnvError(ConfigError):
    """A launcher variable is not what the launcher writes (exit 2, one line naming it)."""


def env_int(environ: Mapping[str, str], name: str, low: int, high: int, default: int | None = None) -> int:
    """``environ[name]`` as an integer in ``[low, high]``; ``default`` when unset or empty (else it is required)."""
    raw = environ.get(name, "")
    if raw == "" and default is not None:
        return default
    text = raw  # as the launcher writes it: no blanks, no signs of other notations (0x50, 1e3, ٣)
    if not re.fullmatch(r"-?[0-9]{1,19}", text, flags=re.ASCII) or not low <= int(text) <= high:
        raise LaunchEnvError(f"{name}={raw!r:.60} is not an integer from {low} to {high}; the launcher's environment "
                             "is broken (unset it, or launch through hpc-train)")
    return int(text)


def restart_count(environ: Mapping[str, str], name: str) -> int:
    """A restart counter (``SLURM_RESTART_COUNT``, ``TORCHELASTIC_RESTART_COUNT``): 0 when unset."""
    return env_int(environ, name, 0, MAX_RESTARTS, default=0)


def master_port(environ: Mapping[str, str], default: int | None = None) -> int:
    """``MASTER_PORT``: a TCP port, 1-65535."""
    return env_int(environ, "MASTER_PORT", 1, 65535, default)


def job_id(environ: Mapping[str, str], name: str = "SLURM_JOB_ID") -> str:
    """A Slurm job id as Slurm writes it (digits, or ``<id>_<task>``)."""
    raw = environ.get(name, "")
    if not _JOB_ID.fullmatch(raw):
        raise LaunchEnvError(f"{name}={raw!r:.60} is not a Slurm job id; the launcher's environment is broken")
    return raw


def instance_restart(instance: str, name: str) -> int:
    """The restart count at the end of a launch instance id (``local:<run>.<restart>``; none: 0)."""
    if "." not in instance:
        return 0
    count = instance.rsplit(".", 1)[-1]
    if not count.isdigit() or int(count) > MAX_RESTARTS:
        raise LaunchEnvError(f"{name}={instance!r:.60} does not end in a restart count (.0, .1, ...); the "
                             "launcher's environment is broken")
    return int(count)
