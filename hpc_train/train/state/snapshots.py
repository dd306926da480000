"""Checkpoints without stalls: capture the training state into host memory, write it in the background.

:meth:`Checkpointer.capture` copies every tensor of the state (model, optimizer, scaler, BatchNorm
statistics, the stage-1 snapshot) into host memory — pinned buffers kept from one checkpoint to the
next on CUDA, filled with non-blocking copies queued behind the steps already launched, so the host
does not wait for the GPU — and records an event. A writer thread waits for that event and writes the
file exactly as before (:func:`~.checkpoint.save_atomic`: temporary file, fsync, rename, fsync of the
directory; then the old ones are pruned). Training continues meanwhile; the next capture first waits
for the previous write (checkpoints are far apart), and a write that failed raises there.

``wait=True`` (the end of a stage, preemption) returns only when the file is on disk: the preemption
checkpoint is written and fsynced before any requeue or exit. The file format and resume semantics
are those of :mod:`.checkpoint`; :meth:`Checkpointer.restore` reads the newest complete one, and
:func:`resume` puts a trainer back where it left off; :func:`trainer_state` is what goes in.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..loop.step import reads_tensor_lr
from ..model.batchnorm import broadcast_buffers
from . import checkpoint as ckpt

if TYPE_CHECKING:
    from ..loop.engine import Trainer

log = logging.getLogger("hpc_train.train")


class Checkpointer:
    """Snapshots of one rank's state; ``writer`` (rank 0) writes them to ``run_dir``."""

    def __init__(self, run_dir: Path, device: torch.device, *, keep: int, writer: bool) -> None:
        self.run_dir, self.device, self.keep, self.writer = run_dir, device, keep, writer
        self._pinned: dict[tuple, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.stall_s: list[float] = []
        """Host time each capture took (what a checkpoint costs the training loop)."""

    # ------------------------------------------------------------------------------------------------
    # Capture
    # ------------------------------------------------------------------------------------------------

    def _host_copy(self, key: tuple, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if tensor.device.type != "cuda":
            return tensor.clone()  # training goes on mutating the original while the writer pickles
        buf = self._pinned.get(key)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._pinned[key] = buf
        buf.copy_(tensor, non_blocking=True)
        return buf

    def _copy(self, value: Any, key: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            return self._host_copy(key, value)
        if isinstance(value, dict):
            return {k: self._copy(v, key + (k,)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._copy(v, key + (i,)) for i, v in enumerate(value))
        return value

    def capture(self, state: dict[str, Any]) -> tuple[dict[str, Any], torch.cuda.Event | None]:
        """A host copy of ``state`` (tensors copied, everything else as is) and the event after which
        the copies are complete (None on the CPU, where they already are)."""
        self.wait()  # the previous write holds the pinned buffers
        host = self._copy(state, ())
        if self.device.type != "cuda":
            return host, None
        event = torch.cuda.Event()
        event.record()
        return host, event

    # ------------------------------------------------------------------------------------------------
    # Write
    # ------------------------------------------------------------------------------------------------

    def save(self, state: dict[str, Any], global_step: int, *, wait: bool) -> Path:
        """Capture ``state`` and (rank 0) write it as the checkpoint of ``global_step``; in the background
        unless ``wait``. Every rank calls it (the capture is also what keeps ranks' pinned buffers warm)."""
        started = time.monotonic()
        path = ckpt.checkpoint_path(self.run_dir, global_step)
        if self.writer:
            host, event = self.capture(state)
            self._thread = threading.Thread(target=self._write, args=(host, event, path), daemon=True,
                                            name="hpc-train-checkpoint")
            self._thread.start()
        self.stall_s.append(time.monotonic() - started)
        if wait:
            self.wait()
        return path

    def _write(self, host: dict[str, Any], event: torch.cuda.Event | None, path: Path) -> None:
        try:
            if event is not None:
                event.synchronize()
            ckpt.save_atomic(host, path)
            ckpt.prune(self.run_dir, self.keep)
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait() on the training thread
            self._error = exc

    def wait(self) -> None:
        """Until the last write is on disk; raises what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            where = ckpt.checkpoint_dir(self.run_dir)
            raise RuntimeError(f"writing a checkpoint to {where} failed: {error}") from error

    # ------------------------------------------------------------------------------------------------
    # Restore
    # ------------------------------------------------------------------------------------------------

    def restore(self) -> tuple[dict[str, Any], Path] | None:
        """The newest complete checkpoint (an unreadable one falls back to the previous), on the CPU."""
        return ckpt.load_latest(self.run_dir, map_location="cpu")


# --------------------------------------------------------------------------------------------------
# What a checkpoint holds, and putting it back
# --------------------------------------------------------------------------------------------------


def gather_rng(trainer: Trainer) -> list[dict[str, Any]]:
    """Every rank's RNG states (rank 0 keeps the list), gathered on the CPU group: no GPU drain."""
    mine = ckpt.rng_state()
    if not trainer.ctx.distributed:
        return [mine]
    every: list[Any] = [None] * trainer.ctx.world_size
    dist.all_gather_object(every, mine, group=trainer.agreement.group)
    return every


def trainer_state(trainer: Trainer) -> dict[str, Any]:
    """The checkpoint of ``trainer`` as live references (:meth:`Checkpointer.save` copies them). Every
    rank calls it: RNG states are gathered and rank 0's BatchNorm buffers broadcast, so the statistics
    saved are the ones every rank uses."""
    t = trainer
    rng = gather_rng(t)
    if t.ctx.distributed:
        broadcast_buffers(t.model)
    t.sampler.epoch, t.sampler.step = t.epoch, t.step_in_epoch
    optimizer = t.optimizer.state_dict()
    if reads_tensor_lr(t.optimizer):  # the file keeps the number (the host knows it: nothing is read back)
        lr = t.schedule.base_lr if t._last_lr is None else t._last_lr
        optimizer["param_groups"] = [{**g, "lr": lr} for g in optimizer["param_groups"]]
    return {
        "format": ckpt.FORMAT_VERSION, "phase": t.phase, "epoch": t.epoch, "step_in_epoch": t.step_in_epoch,
        "global_step": t.global_step, "steps_per_epoch": t.steps_per_epoch, "world_size": t.ctx.world_size,
        "model": t.model.state_dict(), "optimizer": optimizer,
        "scaler": t.scaler.state_dict() if t.scaler.is_enabled() else None,
        "scheduler": t.schedule.state_dict(), "sampler": t.sampler.state_dict(),
        "rng": rng, "best": t.best, "last": t.last, "train_counts": t.counts, "stage1": t.stage1,
    }


def resume(trainer: Trainer, state: dict[str, Any], path: Path) -> None:
    """Put ``trainer`` where the checkpoint ``state`` (from ``path``) left off, in place: nothing a
    captured step reads moves. The optimizer keeps this run's lr tensor and kernel choice (a checkpoint
    holds the lr as a number, and whatever kernel wrote it)."""
    t, ctx = trainer, trainer.ctx
    t.model.load_state_dict(state["model"])
    t.epoch, t.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
    t.global_step = int(state["global_step"])
    t.evaluator.best, t.evaluator.last = state.get("best"), state.get("last")
    t.stage1 = state.get("stage1")
    t._setup_phase(state["phase"], reinit_classifier=False)
    if int(state.get("world_size", ctx.world_size)) != ctx.world_size and ctx.is_main:
        # Steps are global batches and augmentations are keyed by global position: nothing changes.
        log.info("checkpoint written by %s ranks, continuing with %d", state.get("world_size"), ctx.world_size)
    keep = [{k: g[k] for k in ("lr", "fused", "foreach", "capturable") if k in g} for g in t.optimizer.param_groups]
    t.optimizer.load_state_dict(state["optimizer"])
    for group, kept in zip(t.optimizer.param_groups, keep):
        group.update(kept)
    if state.get("scaler"):
        t.scaler.load_state_dict(state["scaler"])
    t.sampler.load_state_dict(state["sampler"])
    rng = state["rng"]
    if len(rng) == ctx.world_size:
        ckpt.set_rng_state(rng[ctx.rank])
    t._saved_at_step = t.global_step
    log.info("resumed from %s: epoch %d, step %d of the epoch, %d optimizer steps so far",
             path.name, t.epoch, t.step_in_epoch, t.global_step)
