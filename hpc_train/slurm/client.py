"""Slurm's client commands (squeue, sacct, scancel, sinfo, sbatch --test-only) and what they print.

Every call goes through :func:`run_command`, so errors read the same everywhere: the command, and what
Slurm said. ``squeue`` is asked first and ``sacct`` second (accounting may be absent or rate-limited).
The parsers (:func:`parse_squeue`, :func:`parse_sacct`) are pure functions over the commands' text, tested
on canned outputs recorded from Slurm 22.05 (tests/slurm_outputs/). What Slurm's states mean for a run is said
here, once (:func:`slurm_job`), in the neutral words :mod:`hpc_train.runs.status` folds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Sequence

from ..errors import SubmitError
from ..runs.scheduler_job import EndedBy, Phase, SchedulerJob

_TIMEOUT_S = 30

ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "PREEMPTED_PENDING"})
"""The job is still Slurm's business (queued, running, or about to run again)."""

SQUEUE_FORMAT = "%i|%T|%r|%M|%N"
NO_SLURM = "no Slurm here"
"""The reason of a job's UNKNOWN state where no Slurm client is on PATH."""
SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,NodeList,Reason"


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


_TOOL_PREFIX = re.compile(r"^(sbatch|srun|squeue|sacct|scancel|sinfo|sacctmgr): ((error|fatal): )?")


def slurm_message(text: str) -> str:
    """What Slurm's output says why, in one line, without the noise: its ``fatal:`` line (what ended the tool), else
    its last error line (``sbatch: error: Batch job submission failed: Invalid partition name specified``), with up
    to two earlier error lines (the value, ``invalid partition specified: nope``) after it in parentheses."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if re.match(r"^\w+: fatal: ", ln)]
    errors = [ln for ln in lines if "error" in ln.lower() and ln not in fatal] + fatal[-1:]
    if not errors:
        return _TOOL_PREFIX.sub("", lines[-1]) if lines else "no output"
    said = [_TOOL_PREFIX.sub("", ln) for ln in errors]
    earlier = [ln for ln in dict.fromkeys(said[:-1]) if ln != said[-1]]
    return said[-1] + (f" ({'; '.join(earlier[-2:])})" if earlier else "")


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


RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"})
"""The active states in which the job's processes run (the others wait to start)."""

_ENDED_BY: dict[str, tuple[EndedBy, str]] = {
    "TIMEOUT": ("time_limit", "time limit reached"),
    "OUT_OF_MEMORY": ("failure", "out of memory"),
    "NODE_FAIL": ("failure", "a node failed"),
    "BOOT_FAIL": ("failure", "a node failed to boot"),
    "DEADLINE": ("failure", "deadline reached"),
    "CANCELLED": ("cancel", "cancelled"),
    "PREEMPTED": ("preemption", "preempted by Slurm"),
}
"""Slurm's final states that no exit block records: why Slurm ended the job, and in which words."""


def slurm_job(job_id: str, state: str, *, reason: str = "", elapsed: str = "", nodes: str = "", exit_code: str = "",
              source: str = "") -> SchedulerJob:
    """Slurm's view of a job (``state``: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED,
    REQUEUED ..., or UNKNOWN when neither squeue nor sacct knows it: ``reason`` says why) in the words
    :mod:`hpc_train.runs.status` folds."""
    phase: Phase
    if state == "UNKNOWN":
        phase = "unknown"
    elif state in ACTIVE_STATES:
        phase = "running" if state in RUNNING_STATES else "requeued" if state.startswith("REQUEUE") else "queued"
    else:
        phase = "ended"
    ended_by, cause = _ENDED_BY.get(state, (None, "")) if phase == "ended" else (None, "")
    unanswered = phase == "unknown" and (reason == NO_SLURM or reason.startswith("squeue failed"))
    return SchedulerJob(job_id, state, phase, scheduler="Slurm", reason=reason, elapsed=elapsed, nodes=nodes,
                        exit_code=exit_code, source=source, answered=not unanswered, ended_by=ended_by, cause=cause,
                        succeeded=state == "COMPLETED")


NO_NODES = frozenset({"", "(null)", "None assigned"})
"""What squeue and sacct print for a job that was given no node (sacct: ``None assigned``): no node list."""


def _range_holds(shown: str, job_id: str) -> bool:
    """squeue and sacct show an array's pending (or pending-cancelled) tasks as one record, ``4242_[1-3%2]``
    (``4242_[0,2-5]``): is ``4242_2`` among them?"""
    array, _, task = job_id.partition("_")
    m = re.fullmatch(re.escape(array) + r"_\[([^\]]*)\]", shown)
    if not (m and task.isdigit()):
        return False
    for item in m.group(1).split("%")[0].split(","):
        lo, _, hi = item.partition("-")
        if lo.isdigit() and (hi == "" or hi.isdigit()) and int(lo) <= int(task) <= int(hi or lo):
            return True
    return False


def _record_for(records: Sequence[list[str]], job_id: str, *, bare_array: bool = False) -> list[str] | None:
    """The record that stands for ``job_id``: its own line, else a task range that holds it, else (``bare_array``:
    sacct, for a while after an array ended) the array's line under its bare id, ``4242`` for ``4242_2``."""
    array, _, task = job_id.partition("_")
    for matches in (lambda shown: shown == job_id, lambda shown: _range_holds(shown, job_id),
                    lambda shown: bare_array and task.isdigit() and shown == array):
        found = next((parts for parts in records if matches(parts[0])), None)
        if found is not None:
            return found
    return None


def _nodes(shown: str) -> str:
    return "" if shown in NO_NODES else shown


def parse_squeue(text: str, job_id: str) -> SchedulerJob | None:
    """The job's line of ``squeue -h -o '%i|%T|%r|%M|%N'``; None when it is not queued."""
    records = [parts for line in text.splitlines() if len(parts := line.strip().split("|")) == 5]
    parts = _record_for(records, job_id)
    if parts is None:
        return None
    return slurm_job(job_id, parts[1], reason=parts[2] if parts[2] != "None" else "", elapsed=parts[3],
                     nodes=_nodes(parts[4]), source="squeue")


def parse_sacct(text: str, job_id: str) -> SchedulerJob | None:
    """The job's allocation line of ``sacct -n -P -X -o JobID,State,ExitCode,Elapsed,NodeList,Reason``: its own, or
    the array record that holds it (a pending-cancelled range, the bare array id: :func:`_record_for`)."""
    records = [parts for line in text.splitlines() if len(parts := line.strip().split("|")) >= 5]
    parts = _record_for(records, job_id, bare_array=True)
    if parts is None:
        return None
    state = parts[1].split()[0] if parts[1] else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
    return slurm_job(job_id, state, exit_code=parts[2], elapsed=parts[3], nodes=_nodes(parts[4]),
                     reason=parts[5] if len(parts) > 5 and parts[5] != "None" else "", source="sacct")


def job_state(job_id: str) -> SchedulerJob:
    """One job's state: see :func:`job_states`."""
    return job_states([job_id])[job_id]


def job_states(job_ids: Sequence[str], *, listing: bool = False) -> dict[str, SchedulerJob]:
    """Each job's state from one squeue call, then one sacct call for those no longer queued (a report
    over a sweep of 200 runs asks slurmctld twice, not 400 times). A failing squeue is an error with its
    own message (SubmitError, exit 2) — for a ``listing`` (plain ``status``) every job is UNKNOWN with that
    message instead, so that the runs that can be read are still listed; a failing or absent sacct gives
    UNKNOWN with sacct's own words as the reason; without squeue on PATH every job is UNKNOWN, "no Slurm
    here"."""
    wanted = list(dict.fromkeys(job_ids))
    if not wanted:
        return {}
    if shutil.which("squeue") is None:  # runs read here from a copy of the runs directory, or a laptop
        return {j: slurm_job(j, "UNKNOWN", reason=NO_SLURM) for j in wanted}
    queued = run_command(["squeue", "-h", "-j", ",".join(wanted), "-o", SQUEUE_FORMAT], check=False)
    message = slurm_message(queued.stderr)
    # A single unknown id is an error to squeue ("Invalid job id specified"); in a list it is left out.
    if queued.returncode != 0 and "invalid job id" not in message.lower():
        if listing:
            return {j: slurm_job(j, "UNKNOWN", reason=f"squeue failed: {message}") for j in wanted}
        raise SubmitError(f"squeue failed: {message}")
    states = {j: found for j in wanted if (found := parse_squeue(queued.stdout, j)) is not None}
    gone = [j for j in wanted if j not in states]
    if not gone:
        return states
    if shutil.which("sacct") is None:
        return {**states, **{j: slurm_job(j, "UNKNOWN", reason="not in squeue, and sacct is not on PATH") for j in gone}}
    # An array task is asked by its array id too: sacct may hold only the array's records for it (a range, or
    # the bare array id for a while after the array ended), which it does not list for the task's own id.
    asked = list(dict.fromkeys([*gone, *(j.split("_", 1)[0] for j in gone if "_" in j)]))
    acct = run_command(["sacct", "-n", "-P", "-X", "-j", ",".join(asked), "-o", SACCT_FIELDS], check=False)
    for j in gone:
        if acct.returncode != 0:
            states[j] = slurm_job(j, "UNKNOWN", reason=f"not in squeue; sacct: {slurm_message(acct.stderr or acct.stdout)}")
        else:
            states[j] = parse_sacct(acct.stdout, j) or slurm_job(j, "UNKNOWN",
                                                                reason="not in squeue, and sacct has no record of it")
    return states


DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's default MaxArraySize (slurm.conf(5)): array indices 0 to 1000."""


def max_array_size() -> int:
    """The cluster's ``MaxArraySize`` from ``scontrol show config`` (Slurm's default when it cannot be read): an
    array holds indices 0 to MaxArraySize - 1."""
    if shutil.which("scontrol") is None:
        return DEFAULT_MAX_ARRAY_SIZE
    result = run_command(["scontrol", "show", "config"], check=False)
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", result.stdout, re.M)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else DEFAULT_MAX_ARRAY_SIZE


def cancel(job_id: str) -> None:
    run_command(["scancel", job_id])


def test_only(script_path: str) -> str:
    """``sbatch --test-only``: Slurm's verdict without queueing. Raises SubmitError with Slurm's reason."""
    result = run_command(["sbatch", "--test-only", script_path], check=False)
    text = (result.stderr + result.stdout).strip()
    if result.returncode != 0:
        if any(sign in text.lower() for sign in _UNREACHED):
            raise SubmitError(f"Slurm was not reached, so it did not judge this job (sbatch --test-only: "
                              f"{slurm_message(text)}); check that slurmctld is up and this host's slurm.conf")
        raise SubmitError(f"Slurm would refuse this job: {slurm_message(text)}")
    return text.splitlines()[-1] if text else "ok"


_UNREACHED = ("unable to contact slurm controller", "failed to fetch config", "socket timed out",
              "connection refused", "zero bytes were transmitted or received")
"""How sbatch says it never reached slurmctld (rather than that slurmctld refused the job)."""


def partition_exists(name: str) -> bool:
    result = run_command(["sinfo", "-h", "-p", name, "-o", "%P"])
    return bool(result.stdout.strip())


def account_exists(name: str) -> bool | None:
    """True/False when accounting answers, None when there is no accounting to ask."""
    if shutil.which("sacctmgr") is None:
        return None
    result = run_command(["sacctmgr", "-n", "-P", "show", "account", name, "format=Account"], check=False)
    if result.returncode != 0:
        return None
    return any(line.strip() == name for line in result.stdout.splitlines())


def missing_tools() -> list[str]:
    """Which of the tools a submit needs are not on PATH (sbatch alone is not enough: submitit needs srun)."""
    return [tool for tool in ("sbatch", "srun", "squeue", "scancel") if shutil.which(tool) is None]
