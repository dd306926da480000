"""A scheduler's view of one job, in the words :mod:`hpc_train.runs.status` folds with what the run directory
recorded. A backend fills it in from its own words (:func:`hpc_train.slurm.client.slurm_job` from Slurm's states),
so that ``runs/`` knows what a job's state means without knowing any scheduler. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["queued", "requeued", "running", "ended", "unknown"]
"""Where the job is: waiting to start, waiting to start again, running, no longer the scheduler's business, or
not known (``reason`` says why)."""

EndedBy = Literal["time_limit", "preemption", "cancel", "failure"]
"""Why the scheduler itself ended a job (no exit block records these): its time limit, preemption, a cancel, or a
failure of the scheduler's own (out of memory, a node failed ...)."""


@dataclass(frozen=True)
class SchedulerJob:
    job_id: str
    state: str
    """The scheduler's own word for it (Slurm's PENDING, TIMEOUT ...), shown as it is; UNKNOWN when not known."""
    phase: Phase
    scheduler: str = "Slurm"
    """Its name, in reasons: ``time limit reached (Slurm: TIMEOUT 0:15)``."""
    reason: str = ""
    """The scheduler's reason: why it still waits, or why its state is not known."""
    elapsed: str = ""
    nodes: str = ""
    exit_code: str = ""
    source: str = ""
    """Which of the scheduler's commands answered (squeue, sacct)."""
    answered: bool = True
    """False when the scheduler could not be asked here (no client, or its query failed): a run not recorded as
    ended is then ``unknown``, not what it last recorded."""
    ended_by: EndedBy | None = None
    """For an ended job: why the scheduler ended it, when it did (else the job's own exit ended it)."""
    cause: str = ""
    """What ``ended_by`` means, in words (``time limit reached``, ``out of memory``)."""
    succeeded: bool = False
    """For an ended job: the scheduler counts its exit a success."""

    @property
    def active(self) -> bool:
        """Still the scheduler's business: queued, running, or about to run again."""
        return self.phase in ("queued", "requeued", "running")

    @property
    def said(self) -> str:
        """The scheduler's state and, unless it succeeded, its exit code: ``TIMEOUT 0:15``."""
        return self.state + (f" {self.exit_code}" if self.exit_code and not self.succeeded else "")
