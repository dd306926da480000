"""Checkpoints without stalls: capture the training state into host memory, write it in the background.

:meth:`Checkpointer.capture` copies every tensor of the state (model, optimizer, scaler, BatchNorm
statistics, the stage-1 snapshot) into host memory — pinned buffers kept from one checkpoint to the
next on CUDA, filled with non-blocking copies queued behind the steps already launched, so the host
does not wait for the GPU — and records an event. A writer thread waits for that event and writes the
file exactly as before (:func:`~.checkpoint.save_atomic`: temporary file, fsync, rename, fsync of the
directory; then the old ones are pruned). Training continues meanwhile; the next capture first waits
for the previous write (checkpoints are far apart), and a write that failed raises there.

``wait=True`` (the end of a stage, preemption) returns only when the file is on disk: the preemption
checkpoint is written and fsynced before any requeue or exit. What goes in is the trainer's own
``state_dict()`` (torchtitan's pattern: the checkpointer is handed the object whose state it saves, here
``train_state``); :meth:`Checkpointer.restore` reads the newest complete file (format: :mod:`.checkpoint`) and
hands it to ``train_state.load_state_dict``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from . import checkpoint as ckpt

log = logging.getLogger("hpc_train.train")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Checkpointer:
    """Snapshots of ``train_state`` (the Trainer); ``writer`` (rank 0) writes them to ``run_dir``."""

    def __init__(self, run_dir: Path, device: torch.device, *, keep: int, writer: bool, train_state: Stateful) -> None:
        self.run_dir, self.device, self.keep, self.writer = run_dir, device, keep, writer
        self.train_state = train_state
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

    def save(self, global_step: int, *, wait: bool) -> Path:
        """Capture ``train_state.state_dict()`` and (rank 0) write it as the checkpoint of ``global_step``; in
        the background unless ``wait``. Every rank calls it: the state dict gathers from every rank."""
        state = self.train_state.state_dict()
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

    def save_snapshot(self, state: dict[str, Any], path: Path) -> None:
        """Write ``state`` (rank 0) to ``path`` in the background, captured and written like a checkpoint (the
        best held-out model: :data:`~.checkpoint.BEST_HELD_OUT`)."""
        started = time.monotonic()
        if self.writer:
            host, event = self.capture(state)
            self._thread = threading.Thread(target=self._write, args=(host, event, path, False), daemon=True,
                                            name="hpc-train-snapshot")
            self._thread.start()
        self.stall_s.append(time.monotonic() - started)

    def _write(self, host: dict[str, Any], event: torch.cuda.Event | None, path: Path, prune: bool = True) -> None:
        try:
            if event is not None:
                event.synchronize()
            ckpt.save_atomic(host, path)
            if prune:
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
            if isinstance(error, ckpt.CheckpointWriteError):  # it names the file and why (ENOSPC)
                raise error
            where = ckpt.checkpoint_dir(self.run_dir)
            raise RuntimeError(f"writing a checkpoint to {where} failed: {error}") from error

    # ------------------------------------------------------------------------------------------------
    # Restore
    # ------------------------------------------------------------------------------------------------

    def restore(self) -> Path | None:
        """Load the newest complete checkpoint (an unreadable one falls back to the previous) into
        ``train_state``; its path, or None when there is none."""
        found = ckpt.load_latest(self.run_dir, map_location="cpu")
        if found is None:
            return None
        state, path = found
        try:
            self.train_state.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # another model, or parts of it missing
            raise ckpt.UnreadableCheckpoints(f"{path}: the run cannot continue from it ({ckpt.why_unreadable(exc)}); "
                                             "restore it, or start a new run (another run directory)") from None
        log.info("resumed from %s: epoch %d, step %d of the epoch, %d optimizer steps so far",
                 path.name, state["epoch"], state["step_in_epoch"], state["global_step"])
        return path
