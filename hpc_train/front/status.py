"""The status and cancel side that needs the scheduler: ask the backend for its view of the runs' jobs (Slurm's,
once for all of them), then let :mod:`hpc_train.runs.status` fold it with what each run directory recorded. A local
run needs no scheduler: its run directory and its runner's process say it all.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..errors import ConfigError
from ..runs import liveness, rundir, safe_files
from ..runs import status as folded
from ..runs.index import Run
from ..runs.scheduler_job import SchedulerJob
from ..runs.sweeps import array_ids
from ..slurm import client as slurm_cli


def scheduler_jobs(runs: Sequence[Run], listing: bool = False) -> dict[str, SchedulerJob]:
    """Slurm's view of every Slurm run's job, asked once for all of them (``listing``: a failing squeue makes
    them ``unknown``, with its words, and the other runs are still listed; else it is an error, exit 2)."""
    return slurm_cli.job_states([r.job_id for r in runs if r.on_slurm], listing=listing)


def _scheduler_job(run: Run) -> SchedulerJob | None:
    return slurm_cli.job_state(run.job_id) if run.on_slurm else None


def run_statuses(runs: Sequence[Run], *, listing: bool = False) -> list[dict[str, Any]]:
    """Each run's status (``status``; ``listing``: plain ``status``, every run here)."""
    jobs = scheduler_jobs(runs, listing)
    return [folded.run_status(r, jobs.get(r.job_id) if r.on_slurm else None) for r in runs]


def run_status(run: Run) -> dict[str, Any]:
    return folded.run_status(run, _scheduler_job(run))


def run_states(runs: Sequence[Run]) -> list[str]:
    """The state of each run (``report``, ``cancel`` of a sweep)."""
    jobs = scheduler_jobs(runs)
    return [folded.run_state(r, jobs.get(r.job_id) if r.on_slurm else None)[0] for r in runs]


def run_state(run: Run) -> tuple[str, str]:
    """(state, reason) of one run; reads no log and no metrics (polling loops)."""
    return folded.run_state(run, _scheduler_job(run))


def is_over(run: Run) -> bool:
    return run_state(run)[0] in rundir.FINAL_STATES | {"unknown"}


def _check_recordable(run: Run) -> None:
    """Before a job is cancelled: the cancel can be recorded (a read-only runs directory, a state log that is not a
    regular file), else exit 2 with the reason: a cancel nobody can see in ``status`` is not done half-way."""
    path = run.run_dir / rundir.STATE_LOG
    try:
        os.close(safe_files.open_append(path, within=run.run_dir))
    except OSError as exc:
        raise ConfigError(f"cannot record the cancel of {run.name} in {path} ({exc.strerror or exc}); nothing "
                          "was cancelled") from None


def _record_cancelled(run: Run) -> None:
    # The local runner ends the ranks when it sees this line; on Slurm it says who cancelled, which sacct cannot.
    try:
        rundir.append_event(run.run_dir, rundir.CANCELLED, writer="hpc-train cancel", reason="cancelled by the user")
    except OSError as exc:  # a full disk: checked writable just before, the line itself did not fit
        done = "" if run.cluster == "local" else f"job {run.job_id} was cancelled (scancel), but "
        raise ConfigError(f"{run.name}: {done}the cancel could not be recorded in {run.run_dir / rundir.STATE_LOG} "
                          f"({exc.strerror or exc})") from None


def cancel_sweep(runs: Sequence[Run]) -> str:
    """Cancel every point of a sweep: each of its job arrays once (scancel), each point not ended recorded."""
    live = [r for r, state in zip(runs, run_states(runs)) if state not in rundir.FINAL_STATES]
    for run in live:
        _check_recordable(run)
    arrays = list(dict.fromkeys(i for r in live if r.cluster != "local" for i in (array_ids(r) or [r.job_id])))
    for array in arrays:
        slurm_cli.cancel(array)
    for run in live:
        _record_cancelled(run)
    if not live:
        return f"{len(runs)} point(s): all have already ended; nothing to cancel"
    where = f" (job arrays {', '.join(arrays)})" if arrays else " (local runs)"
    return f"cancelled {len(live)} of {len(runs)} point(s){where}"


def cancel_run(run: Run) -> str:
    """Cancel a run: record it (the local runner ends the ranks when it sees it), and scancel on Slurm."""
    if run.unreadable:
        raise ConfigError(f"{run.name}: {run.unreadable}, so which job to cancel cannot be told; cancel it with "
                          "scancel JOB_ID (or, for a local run, end its launcher)")
    rundir.read_state(run.run_dir)  # a state log that is a symlink, FIFO or wrong: exit 2 before anything is done
    state = run_state(run)[0]
    if state in rundir.FINAL_STATES:
        return f"{run.name} has already ended ({state}); nothing to cancel"
    _check_recordable(run)
    alone = _alone_process(run) if run.record.get("alone") else None
    if run.cluster != "local":
        slurm_cli.cancel(run.job_id)
    _record_cancelled(run)
    if alone is not None:
        return f"cancelled {run.name} ({_end_alone(run, alone)})"
    if run.cluster == "local":
        return f"cancelled {run.name} (local run{_end_orphans(run)})"
    return f"cancelled {run.name} (job {run.job_id})"


ALONE_KILL_WAIT_S = 30.0
"""How long ``cancel`` gives a ``train`` run alone to checkpoint after SIGTERM before SIGKILL (Slurm's default
KillWait: the process writes its checkpoint at the next step)."""


def _alone_process(run: Run) -> int:
    """The process of a ``train`` run alone, checked before anything is recorded: this user's, carrying the run
    directory in its environment (else exit 2, nothing cancelled)."""
    pid = int(run.record.get("launcher_pid") or 0)
    if not pid:
        raise ConfigError(f"{run.name} has not recorded its process yet ({rundir.RANKS_DIR}/rank-0.json); nothing "
                          "was cancelled: try again in a few seconds")
    if not liveness.run_process(pid, run.run_dir):
        raise ConfigError(f"{run.name}: process {pid} is not this user's or does not carry {run.run_dir} in its "
                          f"environment ({rundir.RUN_DIR_ENV}); nothing was cancelled: end the run yourself")
    return pid


def _end_alone(run: Run, pid: int) -> str:
    """SIGTERM to the process (it checkpoints), SIGKILL after :data:`ALONE_KILL_WAIT_S`; then the cancel is recorded
    again, after the lines the process wrote while it ended (its ``preempted`` would otherwise be the run's state),
    saying what became of it — as the local launcher records a cancelled launch."""
    before = len(rundir.read_events(run.run_dir))
    if liveness.end_process(pid, run.run_dir, ALONE_KILL_WAIT_S):
        checkpointed = any(e.get("event") == rundir.PREEMPTED and e.get("exit_code") == rundir.EXIT_CHECKPOINTED
                           for e in rundir.read_events(run.run_dir)[before:])  # what it wrote while it ended
        outcome = (f"it checkpointed (exit {rundir.EXIT_CHECKPOINTED})" if checkpointed
                   else "it ended without a checkpoint")
        code = rundir.EXIT_CHECKPOINTED if checkpointed else None
    else:
        outcome, code = f"it did not end within {ALONE_KILL_WAIT_S:.0f} s of SIGTERM and was killed (SIGKILL)", None
    known = {"exit_code": code} if code is not None else {}
    rundir.append_event(run.run_dir, rundir.CANCELLED, writer="hpc-train cancel", reason=f"cancelled by the user; "
                        f"{outcome}", **known)
    return f"train run alone: process {pid} signalled; {outcome}"


def _end_orphans(run: Run) -> str:
    """A local run whose launcher died while its ranks ran: nobody else will end them (its live runner does,
    seeing the cancel line)."""
    pid = int(run.record.get("launcher_pid") or 0)
    if not pid or liveness.is_alive(pid):
        return ""
    ended = liveness.end_orphans(run.run_dir)
    if not ended:
        return ""
    return f"; ended {len(ended)} process(es) its dead launcher left: pids {', '.join(map(str, ended))}"
