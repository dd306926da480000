"""Preemption: the signal only sets a flag; the trainer checkpoints, rank 0 requeues, every rank exits.

Slurm sends ``--signal`` (USR2 by default) some time before the time limit or on preemption, and
SIGTERM when it ends a job. The default action of both kills the process, and Slurm may send the signal
seconds after a task starts, so :func:`install` runs first thing in every rank, before torch is
imported (this module imports nothing heavy). The handler does no I/O and takes no locks: it records
which signal came and returns. The trainer polls :func:`requested` at step boundaries, the ranks agree
on it with one all-reduce, all of them take part in an atomic checkpoint, and then:

* rank 0 requeues the job with ``scontrol requeue <id>`` when the configured signal (not SIGTERM, which
  is also what ``scancel`` sends) asked for it, ``slurm.requeue`` is on, ``SLURM_RESTART_COUNT`` is below
  ``slurm.max_requeues`` and we run under Slurm — every rank then exits with :data:`EXIT_REQUEUED` (0);
* otherwise every rank exits with :data:`EXIT_CHECKPOINTED` (75, EX_TEMPFAIL): the checkpoint is in the
  run directory and ``hpc-train submit --resume RUN`` continues from it.

On every start the trainer resumes from the newest complete checkpoint, so a requeued job picks up
where it stopped.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from .. import launch_env
from ..runs import rundir

log = logging.getLogger("hpc_train.train")

EXIT_REQUEUED = rundir.EXIT_OK
"""Checkpoint written and the job requeued: this instance ends successfully, the next one resumes."""
EXIT_CHECKPOINTED = rundir.EXIT_CHECKPOINTED
"""Checkpoint written, not requeued (EX_TEMPFAIL): continue the run with ``hpc-train submit --resume``."""

_received: list[tuple[str, float]] = []  # (signal name, monotonic time); appended by the handler only
_requeue_signals: set[str] = {"USR2"}
_installed: set[str] = set()


def _handler(signum: int, _frame: object) -> None:
    # Runs between two bytecodes of the main thread: keep it to an append (no logging, no locks).
    _received.append((signal.Signals(signum).name.removeprefix("SIG"), time.monotonic()))


def signal_number(name: str) -> int:
    """``USR2``, ``SIGUSR2`` or ``12`` → the signal number (ValueError when unknown)."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    return int(getattr(signal, text if text.startswith("SIG") else f"SIG{text}"))


def install(requeue_signal: str = "USR2", also: Iterable[str] = ("TERM",)) -> None:
    """Catch ``requeue_signal`` (the one ``slurm.signal`` names) and ``also`` (SIGTERM): set a flag only.

    Idempotent; a later call with another signal adds it (``main`` installs USR2 and TERM before it
    has read the job file, then the job's own signal). System calls interrupted by the signal are
    restarted (``siginterrupt(False)``), so a blocking collective or read does not fail with EINTR.
    """
    name = signal.Signals(signal_number(requeue_signal)).name.removeprefix("SIG")
    _requeue_signals.add(name)
    for sig_name in (name, *also):
        num = signal_number(sig_name)
        canonical = signal.Signals(num).name.removeprefix("SIG")
        if canonical in _installed and signal.getsignal(num) is _handler:
            continue
        try:
            signal.signal(num, _handler)
        except ValueError:  # not the main thread: only the main thread may set handlers
            log.warning("cannot install the preemption handler for SIG%s outside the main thread", canonical)
            continue
        signal.siginterrupt(num, False)
        _installed.add(canonical)


def requested() -> bool:
    """A preemption signal arrived in this process (the trainer all-reduces this across ranks)."""
    return bool(_received)


def requeue_requested() -> bool:
    """The signal that arrived asks for a requeue (the configured one), not just an exit (SIGTERM)."""
    return any(name in _requeue_signals for name, _ in _received)


def received() -> list[str]:
    return [name for name, _ in _received]


def reset() -> None:
    """Forget received signals (for a new run in the same process, e.g. tests)."""
    _received.clear()


# --------------------------------------------------------------------------------------------------
# Requeue (rank 0)
# --------------------------------------------------------------------------------------------------


def requeue_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` for array tasks, else ``$SLURM_JOB_ID``."""
    env = os.environ if environ is None else environ
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or None


@dataclass(frozen=True)
class RequeueDecision:
    requeue: bool
    reason: str
    job_id: str | None = None


def decide_requeue(*, requeue_enabled: bool, max_requeues: int, by_requeue_signal: bool,
                   environ: Mapping[str, str] | None = None, scontrol: str | None = None) -> RequeueDecision:
    """Whether rank 0 should requeue; pure apart from looking ``scontrol`` up on PATH."""
    env = os.environ if environ is None else environ
    job_id = requeue_job_id(env)
    if not by_requeue_signal:
        return RequeueDecision(False, "SIGTERM (job cancelled or ended by Slurm): not requeueing", job_id)
    if not requeue_enabled:
        return RequeueDecision(False, "slurm.requeue is off", job_id)
    if job_id is None:
        return RequeueDecision(False, "not running under Slurm (no SLURM_JOB_ID)", None)
    restarts = launch_env.restart_count(env, "SLURM_RESTART_COUNT")
    if restarts >= max_requeues:
        return RequeueDecision(False, f"already restarted {restarts} times (slurm.max_requeues={max_requeues})",
                               job_id)
    if (scontrol or shutil.which("scontrol")) is None:
        return RequeueDecision(False, "scontrol is not on PATH", job_id)
    return RequeueDecision(True, f"restart {restarts + 1} of at most {max_requeues}", job_id)


def requeue(job_id: str, *, timeout_s: float = 60.0) -> tuple[bool, str]:
    """Run ``scontrol requeue <job_id>``; returns (ok, message). Never raises."""
    scontrol = shutil.which("scontrol") or "scontrol"
    try:
        proc = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"scontrol requeue {job_id} failed: {exc}"
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        return False, f"scontrol requeue {job_id} exited {proc.returncode}: {detail[-1] if detail else ''}"
    return True, f"requeued job {job_id}"


class Preempted(Exception):
    """Raised on every rank after the preemption checkpoint; ``exit_code`` is what the rank exits with."""

    def __init__(self, *, requeued: bool, message: str, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.requeued = requeued
        self.checkpoint = checkpoint
        self.exit_code = EXIT_REQUEUED if requeued else EXIT_CHECKPOINTED
