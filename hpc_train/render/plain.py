"""``hpc-train render``'s script: the plain form, with everything it needs from the job alone (no submit path)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from ..config import JobSources, JobSpec
from ..runs import rundir
from .script import LaunchSpec, array_tasks, render_sbatch


def resolve_python(spec: JobSpec, interpreter: str | None = None) -> str:
    """The interpreter the ranks run: explicit > activated venv/conda (``python``) > container
    (``python3``, the host's path means nothing inside) > the one running hpc-train."""
    s = spec.slurm
    if s.python:
        return s.python
    if s.venv or s.conda_env:
        return "python"
    if s.container is not None:
        return "python3"
    return interpreter or sys.executable


def array_range(count: int, max_parallel: int | None) -> str:
    """``--array`` for ``count`` tasks, at most ``max_parallel`` at once."""
    return f"0-{count - 1}%{min(count, max_parallel or count)}"


def render_plain(spec: JobSpec, sources: JobSources, *, cwd: Path | None = None, interpreter: str | None = None,
                 sweep: Sequence[JobSpec] = (), max_parallel: int | None = None) -> str:
    """The self-contained script ``hpc-train render`` prints (admins ``sbatch`` it by hand)."""
    launch = LaunchSpec()
    if sweep:
        tasks = array_tasks(len(sweep), spec.slurm.pack)
        launch = LaunchSpec(stdout="slurm-%x-%A_%a.out", stderr="slurm-%x-%A_%a.out",
                            array=array_range(tasks, max_parallel))
    return render_sbatch(spec, runs_root=str(rundir.runs_root(spec.runs_dir, cwd)),
                         python=resolve_python(spec, interpreter), launch=launch, site_dirs=sources.template_dirs,
                         array_specs=sweep)
