"""Submitting a job wherever it runs: choose the cluster (Slurm when its tools are here, else this machine),
check that the run index can be written, take the code snapshot, hand the job to a backend
(:func:`hpc_train.slurm.queue.queue` or :func:`hpc_train.local.plan.submit_local`) and register its runs in the
index. Returns at once;
:mod:`.follow` follows the runs to their end.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Literal, Sequence

from ..config import JobSpec, Resolved
from ..errors import ConfigError, SubmitError
from ..runs.index import check_writable, register
from ..runs.submission import SubmitResult, code_snapshot
from ..slurm import client as slurm_cli

Cluster = Literal["auto", "slurm", "local"]


def choose_cluster(requested: Cluster, spec: JobSpec) -> tuple[Literal["slurm", "local"], str]:
    """``auto``: Slurm when ``sbatch`` is on PATH, else local (said plainly). Slurm needs srun too."""
    if requested == "slurm" or (requested == "auto" and shutil.which("sbatch") is not None):
        missing = slurm_cli.missing_tools()
        if missing:
            have = "sbatch is" if "sbatch" not in missing else "Slurm's tools are"
            raise SubmitError(f"{have} not complete here: {', '.join(missing)} not on PATH; run on a Slurm login "
                              "node, or use --cluster local to run on this machine")
        return "slurm", ""
    note = "" if requested == "local" else "Slurm not found (no 'sbatch' on PATH): running locally on this machine"
    if spec.slurm.nodes > 1:
        why = "--cluster local" if requested == "local" else "Slurm is not available"
        raise ConfigError(f"{spec.slurm.nodes} nodes requested but {why}; a local run uses one node: "
                          "use --nodes 1, or submit from a Slurm login node")
    return "local", note


def submit(resolved: Resolved, *, cluster: Cluster = "auto", cwd: Path | None = None, interpreter: str | None = None,
           max_parallel: int | None = None, resume_dir: Path | None = None, chain: int = 1,
           snapshot: bool = False, locks: Sequence[int] = ()) -> SubmitResult:
    """Submit and return at once; :func:`hpc_train.front.follow.wait_for` follows the runs to their end.

    ``resolved.sweep``: a run per point (on Slurm, job arrays). ``resume_dir``: continue that run directory in a
    new job. ``chain``: that many jobs (launches, locally), each starting after the previous one ended and resuming
    the same run directory — for sites without requeue. ``snapshot``: record the submit directory's code (git SHA,
    uncommitted diff) in each new run directory. ``locks``: the launch lock of ``resume_dir``, held
    (:mod:`hpc_train.runs.launch_lock`): a local runner holds it on for its launches; a Slurm run's record does once
    its job is queued.
    """
    chosen, note = choose_cluster(cluster, resolved.spec)
    check_writable()  # the run index: before anything is queued
    code = code_snapshot((cwd or Path.cwd()).resolve()) if snapshot else None
    if snapshot and code is None:
        note = "; ".join(n for n in (note, "--snapshot: the submit directory is not in a git repository") if n)
    if chosen == "local":
        from ..local.plan import submit_local

        result = submit_local(resolved, cwd=cwd, resume_dir=resume_dir, chain=chain, note=note, snapshot=code,
                              locks=locks)
    else:
        from ..slurm.queue import queue

        result = queue(resolved, cwd=cwd, interpreter=interpreter, max_parallel=max_parallel, resume_dir=resume_dir,
                       chain=chain, snapshot=code)
    warning = register([Path(d) for d in result.run_dirs], (cwd or Path.cwd()).resolve())
    return dataclasses.replace(result, note="; ".join(n for n in (result.note, warning) if n))
