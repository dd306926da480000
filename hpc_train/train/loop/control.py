"""Decisions every rank must take at the same step, agreed without making the host wait for the GPU.

A few flags decide whether training stops or checkpoints at a step boundary: a preemption signal arrived
(on any rank), it was the requeue signal, a time-based checkpoint is due (rank 0's clock) and a loss went
non-finite. Every rank holds its own and the job needs their OR, the same on every rank.

With several ranks they are all-reduced on a CPU process group of their own (gloo), so the GPU's queue
never drains for them: at a check the all-reduce of the current flags is started without waiting, and
the one started at the previous check is read — long finished by then, so reading it costs nothing.
A flag therefore acts at the check after the one it was sent with; every rank reads the same result at
the same step. At the end of an epoch the agreement is immediate (it waits), and one rank alone needs no
agreement at all.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...rank import preempt


@dataclass(frozen=True)
class Flags:
    stop: bool = False
    """A preemption signal arrived."""
    requeue: bool = False
    """It is the configured requeue signal (not SIGTERM)."""
    checkpoint: bool = False
    """A time-based checkpoint is due."""
    nonfinite: bool = False
    """The loss went non-finite."""

    def __or__(self, other: "Flags") -> "Flags":
        return Flags(*(a or b for a, b in zip(self.values(), other.values())))

    def values(self) -> tuple[bool, ...]:
        return (self.stop, self.requeue, self.checkpoint, self.nonfinite)


class Agreement:
    """The OR of every rank's :class:`Flags` (see the module docstring). ``distributed``: a default
    process group is up; a gloo group of all ranks is made for the flags, with the job's
    ``train.process_group_timeout_s`` (``new_group`` does not take the default group's timeout: without it a
    rank that stopped left the others in this group's collectives for torch's default of 30 minutes)."""

    def __init__(self, distributed: bool, timeout_s: float | None = None) -> None:
        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
        self.group = dist.new_group(backend="gloo", timeout=timeout) if distributed else None
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def _start(self, flags: Flags) -> tuple[dist.Work, torch.Tensor]:
        box = torch.tensor([int(v) for v in flags.values()], dtype=torch.int32)
        work = dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return work, box

    def _collect(self) -> Flags:
        if self._pending is None:
            return Flags()
        work, box = self._pending
        self._pending = None
        work.wait()
        return Flags(*(bool(v) for v in box.tolist()))

    def poll(self, mine: Flags) -> Flags:
        """At a step check: the agreed flags of the previous check (this rank's own at world size 1);
        ``mine`` goes out for the next one."""
        if self.group is None:
            return mine
        previous = self._collect()
        self._pending = self._start(mine)
        return previous

    def now(self, mine: Flags) -> Flags:
        """Agreed flags right now (an epoch end; waits for the other ranks): anything still in flight
        from the last check, or-ed with everyone's current flags."""
        if self.group is None:
            return mine
        previous = self._collect()
        work, box = self._start(mine | previous)
        work.wait()
        return Flags(*(bool(v) for v in box.tolist()))

    def _now_one(self, flag: bool) -> bool:
        box = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self.group)
        return bool(int(box))

    def agree_all(self, ok: bool) -> bool:
        """True only when ``ok`` on every rank (e.g. a CUDA graph captured everywhere); waits."""
        return ok if self.group is None else not self._now_one(not ok)

    def agree_any(self, flag: bool) -> bool:
        """True when ``flag`` on any rank (e.g. rank 0 requeued the job); waits."""
        return flag if self.group is None else self._now_one(flag)

    def barrier(self) -> None:
        """A barrier of all ranks on the CPU group (the GPU's queue is not drained)."""
        if self.group is not None:
            dist.barrier(group=self.group)


def requeue_or_stop(agreement: Agreement, *, is_main: bool, requeue_enabled: bool, max_requeues: int,
                    by_requeue_signal: bool, checkpoint_name: str, run_dir: object) -> tuple[bool, str]:
    """After the preemption checkpoint: rank 0 requeues the job when the rules allow it (:mod:`~hpc_train.rank.
    preempt`), every rank learns the outcome; returns it with the line that says so."""
    requeued, message = False, ""
    if is_main:
        decision = preempt.decide_requeue(requeue_enabled=requeue_enabled, max_requeues=max_requeues,
                                          by_requeue_signal=by_requeue_signal)
        if decision.requeue and decision.job_id:
            requeued, message = preempt.requeue(decision.job_id)
        else:
            message = f"not requeued: {decision.reason}"
    requeued = agreement.agree_any(requeued)  # rank 0's outcome, on every rank
    if requeued:
        return True, f"checkpoint {checkpoint_name} written; job requeued ({message or 'by rank 0'})"
    return False, (f"checkpoint {checkpoint_name} written, run stopped ({message or 'see rank 0'}); continue it "
                   f"with: hpc-train submit --resume {run_dir}")
