"""Following a submission to its end (``submit --wait``): rank 0's log as it comes, then each run's final state,
wherever it ran.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ..errors import JobFailedError
from ..runs import liveness, rundir
from ..runs.index import load_run
from ..runs.status import follow_logs
from ..runs.status_lines import not_completed_message
from ..runs.submission import SubmitResult
from ..runs.sweeps import sweep_status
from .status import is_over, run_status

WAIT_POLL_S = 1.0


def stream_rank0(result: SubmitResult, echo: Callable[[str], Any], poll_s: float = 0.5,
                 since: dict[Path, int] | None = None) -> None:
    """Print rank 0's log lines as they come, until the run has ended (``--wait`` of one run); ``since``: where
    each log ended before this launch (``--resume``: the earlier launches' lines are not printed again)."""
    if len(result.run_dirs) != 1:
        return  # an array or a local sweep: too many streams to interleave; wait_for reports
    run = load_run(Path(result.run_dirs[0]))
    for line in follow_logs(run, 0, follow=True, poll_s=poll_s, is_done=lambda: is_over(run), prefix=False,
                            since=since):
        echo(line)


def wait_for(result: SubmitResult, poll_s: float = WAIT_POLL_S) -> list[dict[str, Any]]:
    """Block until every run of the submission has ended; an error saying why when one did not complete (a
    sweep: every point that did not): exit 2 when each refused its configuration or data (a rank's own
    message), else exit 1."""
    statuses, runs = [], [load_run(Path(d)) for d in result.run_dirs]
    for run in runs:
        pid = int(run.record.get("launcher_pid") or 0)
        # A local runner may still have launches of this run to go (a chain); Slurm shows a chain's next
        # job in squeue, which keeps the run queued.
        while not is_over(run) or (pid and liveness.is_alive(pid)):
            time.sleep(poll_s)
        statuses.append(run_status(run))
    missed = [s for s in statuses if s["state"] != rundir.COMPLETED]
    if not missed:
        return statuses
    if len(runs) > 1:
        message = not_completed_message(sweep_status(runs[0], statuses))
        hint = f"see `hpc-train status {result.run_name}` and `hpc-train logs RUN` of each"
    else:
        (status,) = missed
        why = "; ".join(dict.fromkeys(w for w in (status.get("reason"), status.get("first_failure")) if w))
        message = f"{status['run']} {status['state']}: {why or status['state']}"
        hint = status.get("hint") or f"see `hpc-train logs {status['run']}`"
    error = JobFailedError(f"{message}\n{hint}")
    if all(s.get("exit_code") == rundir.EXIT_BAD_INPUT for s in missed):
        error.exit_code = rundir.EXIT_BAD_INPUT
    raise error
