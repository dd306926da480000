"""Between the epochs: what happens when an epoch's steps are launched, owned by :class:`EpochBoundary`.

The epoch boundary makes the host wait for nothing the GPU is still doing:

* Progress and losses are read one epoch behind (:meth:`~.progress.Progress.flush` ``behind``): the epoch's
  end is recorded, what earlier epochs recorded has long landed.
* The ranks agree on the flags (preemption, a due time-based checkpoint, a non-finite loss) on their CPU group:
  :meth:`EpochBoundary.end_epoch` is the epoch-end agreement point, as :meth:`EpochBoundary.check_step` is the
  one every ``preempt_check_every_steps``.
* The epoch's evaluation starts in the background (:meth:`~.evaluation.Evaluator.begin`: a snapshot of the
  weights, evaluated on a stream of its own while the next epoch trains) and is recorded — under its own epoch —
  when the next epoch ends (:meth:`EpochBoundary.settle_evaluation`), or earlier where something needs it: a
  checkpoint (whose evaluator state must hold it), a preemption, the end of the run. A best held-out snapshot
  is written then, from the evaluated weights.
* A checkpoint makes the host wait once: every loss read (a checkpoint never holds weights after a non-finite
  loss the ranks know of), the evaluation recorded. The shipped CIFAR recipes checkpoint by time
  (``checkpoint_every_s``: :class:`CheckpointClock`), not every epoch; the end of each stage and a preemption
  always write one at once.

The boundary owns its state (the checkpoint clock, the evaluation under way) and is handed the objects it drives
(progress, agreement, evaluator, checkpointer ...) once; the Trainer hands it where training stands
(:class:`Position`) at each call, and stays the loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...config import TrainConfig
from ...rank import preempt
from ...runs import rundir
from ..observe import progress as progress_lines
from ..observe.evaluation import Evaluator, Pending
from ..observe.pulse import Pulse
from ..state import checkpoint as ckpt
from ..state.best_held_out import BestHeldOut
from ..state.checkpointer import Checkpointer
from .control import Agreement, Flags, requeue_or_stop
from .step import StepState

log = logging.getLogger("hpc_train.train")


@dataclass(frozen=True)
class Position:
    """Where training stands: what the boundary and the run's status record read."""

    phase: str
    epoch: int
    """Epochs done (the one under way counts from 0)."""
    step_in_epoch: int
    global_step: int
    total_epochs: int


class RunStatus:
    """Rank 0 (``writer``) records the run's state and progress in the run directory (its owner:
    :mod:`hpc_train.runs.rundir`)."""

    def __init__(self, run_dir: Path, *, writer: bool) -> None:
        self.run_dir, self.writer = run_dir, writer

    def write(self, state: str, at: Position, exit_code: int | None = None, **extra: Any) -> None:
        if self.writer:
            instance, restart = rundir.instance_of()
            rundir.append_event(self.run_dir, state, writer="trainer", instance=instance, restart=restart,
                                epoch=at.epoch, step_in_epoch=at.step_in_epoch, global_step=at.global_step,
                                total_epochs=at.total_epochs, exit_code=exit_code, **extra)


class CheckpointClock:
    """When a periodic checkpoint is due, and which step the last one holds. By time (``every_s``): rank 0 asks
    once the time has come, and asks no more until one is written (the ranks act on the agreed flag); else every
    ``every_epochs`` epochs. ``now``: seconds of a monotonic clock."""

    def __init__(self, *, every_s: float | None, every_epochs: int,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.every_epochs, self._now = every_s, every_epochs, now
        self._written_s = now()
        self._asked = False
        self._written_step = -1

    def ask(self) -> bool:
        """Rank 0's flag at an agreement point: a time-based checkpoint is due (True once until one is written)."""
        if not self.every_s or self._asked:
            return False
        self._asked = self._now() - self._written_s >= self.every_s
        return self._asked

    def due_at_epoch_end(self, epoch: int, *, agreed_due: bool) -> bool:
        """At the end of epoch ``epoch`` (epochs done): by time, what the ranks agreed; else every N epochs."""
        return agreed_due if self.every_s else epoch % self.every_epochs == 0

    def holds(self, global_step: int) -> bool:
        """The last checkpoint written (or resumed from) holds ``global_step``: another would be the same."""
        return self._written_step == global_step

    def written(self, global_step: int) -> None:
        """A checkpoint of ``global_step`` is being written: the time counts from now."""
        self._written_step, self._written_s, self._asked = global_step, self._now(), False

    def resumed_at(self, global_step: int) -> None:
        """The run continues from the checkpoint of ``global_step`` (the time still counts from the start)."""
        self._written_step = global_step


class EpochBoundary:
    """The epoch boundary, checkpoints and preemption of one rank's training (module docstring)."""

    def __init__(self, cfg: TrainConfig, *, requeue_enabled: bool, max_requeues: int, run_dir: Path, is_main: bool,
                 state: StepState, progress: progress_lines.Progress, agreement: Agreement, pulse: Pulse,
                 evaluator: Evaluator, best_held_out: BestHeldOut, checkpointer: Checkpointer, has_val: bool,
                 status: RunStatus) -> None:
        self.cfg, self.run_dir, self.is_main, self.has_val = cfg, run_dir, is_main, has_val
        self.requeue_enabled, self.max_requeues = requeue_enabled, max_requeues
        self.state, self.progress, self.agreement, self.pulse = state, progress, agreement, pulse
        self.evaluator, self.best_held_out, self.checkpointer, self.status = (evaluator, best_held_out,
                                                                              checkpointer, status)
        self.clock = CheckpointClock(every_s=cfg.checkpoint_every_s, every_epochs=cfg.checkpoint_every_epochs)
        self.pending: Pending | None = None
        """The evaluation under way in the background (recorded by :meth:`settle_evaluation`)."""

    def flags(self) -> Flags:
        """This rank's flags for the next agreement."""
        return Flags(stop=preempt.requested(), requeue=preempt.requeue_requested(),
                     checkpoint=self.is_main and self.clock.ask(), nonfinite=self.progress.nonfinite_at is not None)

    def check_step(self, at: Position) -> None:
        """Every ``preempt_check_every_steps``: act on the flags agreed at the previous check, send this one's."""
        flags = self.agreement.poll(self.flags())
        self.pulse.beat(global_step=at.global_step, epoch=at.epoch)
        if flags.nonfinite:
            self.stop_nonfinite(at)
        if flags.stop:
            self.preempt(at, flags.requeue)
        if flags.checkpoint and self.clock.every_s:
            self.save_checkpoint(at, wait=False)  # written in the background while training goes on

    def end_epoch(self, at: Position) -> None:
        """After an epoch's steps: read behind, agree, record the previous evaluation and start this one's,
        checkpoint when due, stop if preempted."""
        self.progress.record(self.state.loss, self.state.nonfinite, None, f"epoch {at.epoch} (its end)")
        self.progress.flush(wait=True, behind=True)  # the epochs before this one: long done on the GPU
        flags = self.agreement.now(self.flags())  # the epoch-end agreement point
        self.pulse.epoch_end(global_step=at.global_step, epoch=at.epoch)  # heartbeat, compute times per rank
        if flags.nonfinite:
            self.stop_nonfinite(at)
        self.settle_evaluation(at)
        end_of_phase = at.epoch in (self.cfg.epochs, at.total_epochs)
        if at.epoch % self.cfg.eval_every_epochs == 0 or end_of_phase:
            self.pulse.beat(global_step=at.global_step, epoch=at.epoch, phase="eval")
            self.pending = self.evaluator.begin(epoch=at.epoch, total_epochs=at.total_epochs,
                                                global_step=at.global_step, phase=at.phase, has_val=self.has_val)
        if self.clock.due_at_epoch_end(at.epoch, agreed_due=flags.checkpoint) or end_of_phase:
            self.save_checkpoint(at, wait=end_of_phase)
        if flags.stop and at.epoch < at.total_epochs:
            self.preempt(at, flags.requeue)

    def settle_evaluation(self, at: Position) -> dict[str, Any] | None:
        """Record the evaluation started in the background, if one is under way (its record, or None); a best
        held-out model is written from the weights it evaluated, whatever the checkpoint cadence."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        self.pulse.beat(global_step=at.global_step, epoch=at.epoch, phase="eval")  # reading it may wait for it
        record = self.evaluator.finish(pending)
        if self.evaluator.improved_main:
            self.best_held_out.save(record, pending.model)
        return record

    def save_checkpoint(self, at: Position, *, wait: bool = True) -> Path:
        """All ranks take part (RNG states are gathered); rank 0 writes — in the background unless
        ``wait`` (then the file is on disk on return, every rank past it); returns the path. Every loss is read
        first (a non-finite one stops the run instead, on every rank) and the evaluation under way recorded."""
        path = ckpt.checkpoint_path(self.run_dir, at.global_step)
        if not self.clock.holds(at.global_step):
            self.progress.flush(wait=True)
            if self.agreement.agree_any(self.progress.nonfinite_at is not None):
                self.stop_nonfinite(at)
            self.settle_evaluation(at)  # the checkpoint's evaluator state holds it
            self.checkpointer.save(at.global_step, wait=False)  # every rank: it asks for the trainer's state_dict()
            self.clock.written(at.global_step)
        if wait:
            self.checkpointer.wait()
            self.agreement.barrier()
        self.pulse.beat(global_step=at.global_step, epoch=at.epoch, phase="checkpoint")
        return path

    def stop_nonfinite(self, at: Position) -> None:
        where = self.progress.nonfinite_at or "on another rank"
        message = (
            f"the training loss is not finite (nan or inf), first seen at {where}; stopped after "
            f"{at.global_step} optimizer steps (checkpoints in {self.run_dir} predate it). Lower train.optim.lr "
            "(or lengthen its warm-up), use amp bf16 rather than fp16, or check the data")
        self.status.write(rundir.FAILED, at, exit_code=rundir.EXIT_FAILED, reason=message)
        raise progress_lines.NonFiniteLoss(message)

    def preempt(self, at: Position, by_requeue_signal: bool) -> None:
        mine = preempt.received()
        log.warning("preemption signal (%s) — checkpointing at epoch %d step %d",
                    ",".join(mine) if mine else "on another rank", at.epoch, at.step_in_epoch)
        path = self.save_checkpoint(at, wait=True)  # written and fsynced before any requeue or exit
        requeued, summary = requeue_or_stop(self.agreement, is_main=self.is_main, requeue_enabled=self.requeue_enabled,
                                            max_requeues=self.max_requeues, by_requeue_signal=by_requeue_signal,
                                            checkpoint_name=path.name, run_dir=self.run_dir)
        self.status.write(rundir.REQUEUED if requeued else rundir.PREEMPTED, at,
                          exit_code=rundir.EXIT_OK if requeued else rundir.EXIT_CHECKPOINTED)
        if self.is_main:
            log.warning(summary)
        raise preempt.Preempted(requeued=requeued, message=summary, checkpoint=str(path))
