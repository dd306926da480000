"""Thin wrappers over Slurm's client commands (squeue, sacct, scancel, sinfo, sbatch --test-only).

Every call goes through :func:`run_command`, so errors read the same everywhere: the command, and what
Slurm said. ``squeue`` is asked first and ``sacct`` second (accounting may be absent or rate-limited).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

from .errors import SubmitError

_TIMEOUT_S = 30


def available() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def run_command(argv: Sequence[str], *, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=_TIMEOUT_S, input=input_text,
                                check=False)
    except FileNotFoundError:
        raise SubmitError(f"'{argv[0]}' is not on PATH; run this on a Slurm login node") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"'{' '.join(argv[:2])}' did not answer within {_TIMEOUT_S} s; is slurmctld up?") from None
    if check and result.returncode != 0:
        raise SubmitError(f"{argv[0]} failed: {slurm_message(result.stderr or result.stdout)}")
    return result


def slurm_message(text: str) -> str:
    """The line of Slurm's output that says why (``sbatch: error: ...``), without the noise."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    picked = errors[-1] if errors else (lines[-1] if lines else "no output")
    return re.sub(r"^(sbatch|srun|squeue|sacct|scancel|sinfo): (error: )?", "", picked)


def version() -> tuple[int, int] | None:
    """(major, minor) of the reachable Slurm, e.g. (22, 5); None when it cannot be told."""
    if shutil.which("sinfo") is None:
        return None
    result = run_command(["sinfo", "--version"], check=False)
    m = re.search(r"(\d+)\.(\d+)", result.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def gpu_flag_for(slurm_version: tuple[int, int] | None) -> str:
    """``--gpus-per-node`` exists since Slurm 19.05; older clusters only understand ``--gres``."""
    if slurm_version is not None and slurm_version < (19, 5):
        return "gres"
    return "gpus-per-node"


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    """Slurm's state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED, REQUEUED ...),
    or UNKNOWN when neither squeue nor sacct knows the job."""
    reason: str = ""
    elapsed: str = ""
    nodes: str = ""
    exit_code: str = ""
    source: str = ""
    """Which command answered: squeue or sacct."""
    restarts: int | None = None


def job_state(job_id: str) -> JobState:
    queued = run_command(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r|%M|%N"], check=False)
    for line in queued.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5 and parts[0] == job_id:
            return JobState(job_id, parts[1], reason=parts[2] if parts[2] != "None" else "", elapsed=parts[3],
                            nodes=parts[4], source="squeue")
    if shutil.which("sacct") is not None:
        acct = run_command(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode,Elapsed,NodeList,Reason"],
                           check=False)
        for line in acct.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 5 and parts[0] == job_id:
                state = parts[1].split()[0]  # "CANCELLED by 0" -> CANCELLED
                return JobState(job_id, state, exit_code=parts[2], elapsed=parts[3], nodes=parts[4],
                                reason=parts[5] if len(parts) > 5 and parts[5] != "None" else "", source="sacct")
    return JobState(job_id, "UNKNOWN", reason="not in squeue; sacct has no record (is accounting enabled?)")


def cancel(job_id: str) -> None:
    run_command(["scancel", job_id])


def test_only(script_path: str) -> str:
    """``sbatch --test-only``: Slurm's verdict without queueing. Raises SubmitError with Slurm's reason."""
    result = run_command(["sbatch", "--test-only", script_path], check=False)
    text = (result.stderr + result.stdout).strip()
    if result.returncode != 0:
        raise SubmitError(f"Slurm would refuse this job: {slurm_message(text)}")
    return text.splitlines()[-1] if text else "ok"


def partition_exists(name: str) -> bool:
    result = run_command(["sinfo", "-h", "-p", name, "-o", "%P"], check=False)
    return bool(result.stdout.strip())


def account_exists(name: str) -> bool | None:
    """True/False when accounting answers, None when there is no accounting to ask."""
    if shutil.which("sacctmgr") is None:
        return None
    result = run_command(["sacctmgr", "-n", "-P", "show", "account", name, "format=Account"], check=False)
    if result.returncode != 0:
        return None
    return any(line.strip() == name for line in result.stdout.splitlines())
