"""One rank's lifecycle, shared by ``python -m hpc_train.train``, ``hpc-train train`` (which runs it) and the
submitit callables: signal handlers first, read the job, run it, record how it ended, leave.

Torch-free to import (the handlers must be in place before the seconds-long torch import); torch comes
with :mod:`hpc_train.train.launch`. Exit codes are :mod:`hpc_train.runs.rundir`'s: 0 done (or checkpointed and
requeued), 1 crash, 2 bad configuration or data (one line on stderr saying what to change, and the same
reason in the run's state for ``hpc-train status``), 75 checkpointed but not requeued.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

from ..runs import rundir
from . import heartbeat, preempt
from .dist import rank_and_host
from .outcome import RunOutcome

if TYPE_CHECKING:
    from ..config import JobSpec

log = logging.getLogger("hpc_train.train")


def record_failure(run_dir: str | Path | None, reason: str, exit_code: int) -> None:
    """The failure, in the run's state log (the first failing rank's line is the run's reason)."""
    if not run_dir or not Path(run_dir).is_dir():
        return
    from ..errors import HpcTrainError

    rank, host = rank_and_host()
    try:
        instance, restart = rundir.instance_of()
    except HpcTrainError:  # a broken launcher variable: it is the reason being recorded, for no known launch
        instance, restart = None, None
    try:
        rundir.append_event(run_dir, rundir.FAILED, writer=f"rank {rank if rank is not None else '?'}",
                            instance=instance, restart=restart, rank=rank, host=host, exit_code=exit_code,
                            reason=reason)
    except (OSError, HpcTrainError) as exc:  # the run directory went away or is not safe: the exit code tells
        log.warning("could not record the failure in %s: %s", run_dir, exc)


def run(load_job: Callable[[], tuple["JobSpec", Path | None]], *, run_dir: str | None = None,
        dry_run: bool = False) -> RunOutcome:
    """Read the job (``load_job``) and run this rank; errors become an exit code, a line on stderr and a
    line in the run's state log, never an exception."""
    from ..errors import ConfigError, HpcTrainError

    # First thing: Slurm may send the signal seconds after the task starts, and its default action would
    # kill the rank during the torch import. USR2 and TERM now; the job's own signal once read.
    preempt.install()
    heartbeat.install_stack_dump()  # the watchdog's stack-dump signal (SIGURG) from the start
    known_run_dir = run_dir or os.environ.get(rundir.RUN_DIR_ENV)
    try:
        spec, job_file = load_job()
        if spec.command:
            raise ConfigError("this job runs its own command (command: ...), not the trainer: submit it with "
                              "hpc-train submit, or run a rank with python -m hpc_train.command --resolved JOB")
        preempt.install(spec.slurm.signal)
        try:
            from ..train import launch  # imports torch
        except ImportError as exc:
            raise ConfigError(f"the training code needs the 'train' extra ({exc.name} is missing): "
                              "pip install 'hpc-train[train]'") from None
        return launch.run(spec, run_dir=run_dir, dry_run=dry_run, job_file=job_file)
    except HpcTrainError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        record_failure(known_run_dir, str(exc), exc.exit_code)
        return RunOutcome(exc.exit_code, message=str(exc))
    except Exception as exc:  # noqa: BLE001 - a crash: say which rank and host, keep the traceback
        rank, host = rank_and_host()
        where = f"rank {rank} on {host}" if rank is not None else f"on {host}"
        log.exception("training failed (%s)", where)
        print(f"error: training failed ({where}); see the traceback above", file=sys.stderr, flush=True)
        summary = (str(exc).strip().splitlines() or [""])[0]
        record_failure(known_run_dir, f"{where}: {type(exc).__name__}: {summary}".rstrip(": "), rundir.EXIT_FAILED)
        return RunOutcome(rundir.EXIT_FAILED, message=f"training failed ({where})")


def exit_now(code: int) -> NoReturn:
    """Leave without running C++ static destructors: the work is done and flushed, and torch's process-group
    threads torn down at interpreter exit have aborted ranks of finished jobs (SIGABRT fails the step)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
