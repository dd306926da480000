"""Between the epochs, and at the end: what the Trainer does when an epoch's steps are launched.

The epoch boundary makes the host wait for nothing the GPU is still doing:

* Progress and losses are read one epoch behind (:meth:`~.report.Progress.flush` ``behind``): the epoch's
  end is recorded, what earlier epochs recorded has long landed.
* The ranks agree on the flags (preemption, a due time-based checkpoint, a non-finite loss) on their CPU group:
  :meth:`EpochBoundary.end_epoch` is the epoch-end agreement point, as ``_after_step`` is the one every
  ``preempt_check_every_steps``.
* The epoch's evaluation starts in the background (:meth:`~.evaluation.Evaluator.begin`: a snapshot of the
  weights, evaluated on a stream of its own while the next epoch trains) and is recorded — under its own epoch —
  when the next epoch ends (:meth:`EpochBoundary.settle_evaluation`), or earlier where something needs it: a
  checkpoint (whose evaluator state must hold it), a preemption, the end of the run. A best held-out snapshot
  is written then, from the evaluated weights.
* A checkpoint makes the host wait once: every loss read (a checkpoint never holds weights after a non-finite
  loss the ranks know of), the evaluation recorded. The shipped CIFAR recipes checkpoint by time
  (``checkpoint_every_s``), not every epoch; the end of each stage and a preemption always write one at once.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ...rank import preempt
from ...runs import rundir
from ..observe import report
from ..observe.evaluation import Head, Pending
from ..state import checkpoint as ckpt
from . import graphs
from .control import Flags, requeue_or_stop

log = logging.getLogger("hpc_train.train")


class EpochBoundary:
    """The Trainer's epoch boundary, checkpoints, preemption and end (a part of :class:`~.engine.Trainer`, which
    holds the state these methods read: module docstring)."""

    _pending_eval: Pending | None = None

    def end_epoch(self) -> None:
        """After an epoch's steps: read behind, agree, record the previous evaluation and start this one's,
        checkpoint when due, stop if preempted."""
        t = self.cfg
        self.progress.record(self.state.loss, self.state.nonfinite, None, f"epoch {self.epoch} (its end)")
        self.progress.flush(wait=True, behind=True)  # the epochs before this one: long done on the GPU
        flags = self.agreement.now(self._my_flags())  # the epoch-end agreement point
        self.pulse.epoch_end(self)  # heartbeat and the epoch's compute times (observe/pulse.py)
        if flags.nonfinite:
            self._stop_nonfinite()
        self.settle_evaluation()
        end_of_phase = self.epoch in (t.epochs, self.total_epochs)
        if self.epoch % t.eval_every_epochs == 0 or end_of_phase:
            self.pulse.beat(self, "eval")
            self._pending_eval = self.evaluator.begin(epoch=self.epoch, total_epochs=self.total_epochs,
                                                      global_step=self.global_step, phase=self.phase,
                                                      has_val=self.data.val is not None)
        periodic = flags.checkpoint if t.checkpoint_every_s else self.epoch % t.checkpoint_every_epochs == 0
        if periodic or end_of_phase:
            self.save_checkpoint(wait=end_of_phase)
        if flags.stop and self.epoch < self.total_epochs:
            self._preempt(flags.requeue)

    def settle_evaluation(self) -> dict[str, Any] | None:
        """Record the evaluation started in the background, if one is under way (its record, or None); a best
        held-out model is written from the weights it evaluated, whatever the checkpoint cadence."""
        pending, self._pending_eval = self._pending_eval, None
        if pending is None:
            return None
        self.pulse.beat(self, "eval")  # reading it may wait for the evaluation itself
        record = self.evaluator.finish(pending)
        if self.evaluator.improved_main:
            self.best_held_out.save(record, pending.model)
        return record

    # ------------------------------------------------------------------------------------------
    # Agreement, preemption and checkpoints
    # ------------------------------------------------------------------------------------------

    def _my_flags(self) -> Flags:
        due = False
        t = self.cfg
        if self.ctx.is_main and t.checkpoint_every_s and not self._checkpoint_asked:
            due = self._checkpoint_asked = time.monotonic() - self._last_checkpoint_s >= t.checkpoint_every_s
        return Flags(stop=preempt.requested(), requeue=preempt.requeue_requested(), checkpoint=due,
                     nonfinite=self.progress.nonfinite_at is not None)

    def _stop_nonfinite(self) -> None:
        where = self.progress.nonfinite_at or "on another rank"
        message = (
            f"the training loss is not finite (nan or inf), first seen at {where}; stopped after "
            f"{self.global_step} optimizer steps (checkpoints in {self.run_dir} predate it). Lower train.optim.lr "
            "(or lengthen its warm-up), use amp bf16 rather than fp16, or check the data")
        self._write_status(rundir.FAILED, exit_code=rundir.EXIT_FAILED, reason=message)
        raise report.NonFiniteLoss(message)

    def _preempt(self, by_requeue_signal: bool) -> None:
        mine = preempt.received()
        log.warning("preemption signal (%s) — checkpointing at epoch %d step %d",
                    ",".join(mine) if mine else "on another rank", self.epoch, self.step_in_epoch)
        path = self.save_checkpoint(wait=True)  # written and fsynced before any requeue or exit
        s = self.spec.slurm
        requeued, summary = requeue_or_stop(self.agreement, is_main=self.ctx.is_main, requeue_enabled=s.requeue,
                                            max_requeues=s.max_requeues, by_requeue_signal=by_requeue_signal,
                                            checkpoint_name=path.name, run_dir=self.run_dir)
        self._write_status(rundir.REQUEUED if requeued else rundir.PREEMPTED,
                           exit_code=rundir.EXIT_OK if requeued else rundir.EXIT_CHECKPOINTED)
        if self.ctx.is_main:
            log.warning(summary)
        raise preempt.Preempted(requeued=requeued, message=summary, checkpoint=str(path))

    def save_checkpoint(self, *, wait: bool = True) -> Path:
        """All ranks take part (RNG states are gathered); rank 0 writes — in the background unless
        ``wait`` (then the file is on disk on return, every rank past it); returns the path. Every loss is read
        first (a non-finite one stops the run instead, on every rank) and the evaluation under way recorded."""
        path = ckpt.checkpoint_path(self.run_dir, self.global_step)
        if self._saved_at_step != self.global_step:
            self.progress.flush(wait=True)
            if self.agreement.agree_any(self.progress.nonfinite_at is not None):
                self._stop_nonfinite()
            self.settle_evaluation()  # the checkpoint's evaluator state holds it
            self.checkpointer.save(self.global_step, wait=False)  # every rank: it asks for state_dict()
            self._saved_at_step = self.global_step
            self._last_checkpoint_s, self._checkpoint_asked = time.monotonic(), False
        if wait:
            self.checkpointer.wait()
            self.agreement.barrier()
        self.pulse.beat(self, "checkpoint")
        return path

    # ------------------------------------------------------------------------------------------
    # Evaluation now, and the end
    # ------------------------------------------------------------------------------------------

    def heads(self) -> dict[str, Head]:
        return self.evaluator.heads()

    def evaluate(self, split: str, heads: dict[str, Head]) -> dict[str, tuple[list, list]]:
        """Per-class [correct, count] of each head on ``split``, summed over ranks, now (one host read)."""
        return self.evaluator.evaluate({split: heads})[split]

    def _finish(self, tau_record: dict[str, Any] | None) -> dict[str, Any]:
        timing = {**self.clock.timing(self.total_epochs - self._first_epoch),
                  **graphs.graph_facts(self.captured, self.graphs_reason, self.runner, compiled=self.cfg.compile),
                  "checkpoint_stall_ms_max": round(1000 * max(self.checkpointer.stall_s, default=0.0), 2)}
        summary = report.finish(run_dir=self.run_dir, data_name=self.data.name, num_classes=self.data.num_classes,
                                total_epochs=self.total_epochs, global_step=self.global_step,
                                world_size=self.ctx.world_size, counts=self.counts, best=self.best, last=self.last,
                                best_on_test=self.evaluator.best_on_test,
                                tau_record=tau_record, timing=timing, is_main=self.ctx.is_main)
        self._write_status(rundir.COMPLETED, exit_code=rundir.EXIT_OK)
        self.pulse.beat(self, "done", force=True)
        return summary

    def _write_status(self, state: str, exit_code: int | None = None, **extra: Any) -> None:
        """Rank 0 records the run's state and progress in the run directory (its owner: hpc_train.runs.rundir)."""
        if self.ctx.is_main:
            instance, restart = rundir.instance_of()
            rundir.append_event(self.run_dir, state, writer="trainer", instance=instance, restart=restart,
                                epoch=self.epoch, step_in_epoch=self.step_in_epoch, global_step=self.global_step,
                                total_epochs=self.total_epochs, exit_code=exit_code, **extra)
