"""Evaluation in the background of training: the snapshot it reads, the stream it runs on, the host copy it is
read through.

At an epoch's end the trainer copies the model's weights and buffers into a snapshot (:class:`Snapshot`, one
``_foreach_copy_`` queued behind the epoch's steps) and evaluates the snapshot on a stream of its own
(:class:`Background`), while the next epoch's steps run on the training stream and move the model on; the
per-class counts come back through pinned memory behind an event and are read when the next epoch ends (or when
a checkpoint, a preemption or the end of the run needs them), long after the GPU has finished: no host wait
between epochs. The records still name the epoch they belong to.

On the CPU there is no stream: the work runs when it is submitted, and only its reading is late. A test stands a
deferring fake in for :class:`Background` (the work runs only when its result is read, as a GPU runs it later),
so the CPU tests show that nothing of the next epoch leaks into an evaluation. Several ranks evaluate on the
training stream (their all-reduce inside the evaluation is not run on a second stream: unverified on GPUs); their
reads are late all the same.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
from torch import Tensor, nn


class Snapshot:
    """A copy of a model (weights and buffers, all of them), refreshed in place: what a background evaluation
    reads while training moves the model on. Rebuilt when the model's tensors change (stage 2's new classifier)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self._pairs: tuple[list[Tensor], list[Tensor]] = ([], [])
        self._names: list[tuple[str, torch.Size, torch.dtype]] = []

    @staticmethod
    def _tensors(model: nn.Module) -> list[tuple[str, Tensor]]:
        return [*model.named_parameters(), *model.named_buffers()]

    @torch.no_grad()
    def refresh(self, model: nn.Module) -> nn.Module:
        """The snapshot, now equal to ``model`` (queued on the current stream), in evaluation mode."""
        live = self._tensors(model)
        names = [(name, t.shape, t.dtype) for name, t in live]
        # Same names and shapes are not enough: stage 2 replaces the classifier with a new module of the same
        # shapes, and copying from the old tensors would evaluate stage 1's classifier for the rest of the run.
        if self.model is None or names != self._names or any(a is not b for a, (_, b) in zip(self._pairs[1], live)):
            self.model = copy.deepcopy(model).eval().requires_grad_(False)
            self._names = names
            self._pairs = ([t for _, t in self._tensors(self.model)], [t for _, t in live])
            return self.model
        mine, theirs = self._pairs
        by_dtype: dict[torch.dtype, tuple[list[Tensor], list[Tensor]]] = {}
        for a, b in zip(mine, theirs):
            group = by_dtype.setdefault(a.dtype, ([], []))
            group[0].append(a)
            group[1].append(b.detach())
        for dst, src in by_dtype.values():  # one multi-tensor copy per dtype
            torch._foreach_copy_(dst, src)
        return self.model


class Result:
    """The host copies of an evaluation's device tensors; :meth:`get` returns them once they have arrived."""

    def __init__(self, tensors: Sequence[Tensor], event=None, work: Callable[[], Sequence[Tensor]] | None = None):
        self._tensors, self._event, self._work = list(tensors), event, work

    def ready(self) -> bool:
        return self._work is None and (self._event is None or self._event.query())

    def get(self) -> list[Tensor]:
        """The host tensors, waiting for them only if they are not there yet (a query first: no synchronising
        call when they are)."""
        if self._work is not None:  # the deferring fake: the GPU "runs" the work now
            self._tensors, self._work = list(self._work()), None
        if self._event is not None and not self._event.query():
            self._event.synchronize()
        return self._tensors


class Background:
    """Runs evaluation work on a side stream (CUDA, ``overlap``) and copies its results to pinned host memory
    behind an event; on the CPU, or without ``overlap``, on the current stream (module docstring)."""

    def __init__(self, device: torch.device, *, overlap: bool) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda and overlap else None

    def before_writing(self) -> None:
        """The current stream waits for the side stream's work before it writes what that work reads (the
        snapshot)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def submit(self, work: Callable[[], Sequence[Tensor]]) -> Result:
        """``work()`` (device tensors out), queued after everything on the current stream; its results are read
        through :meth:`Result.get`."""
        if not self.cuda:
            return Result(work())
        if self.stream is None:
            return self._to_host(work())
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            return self._to_host(work())

    @staticmethod
    def _to_host(tensors: Sequence[Tensor]) -> Result:
        # Fresh pinned tensors each time (torch's caching host allocator reuses its blocks once their copies are
        # done), so a result not read yet is never overwritten by the next one.
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for buf, tensor in zip(host, tensors):
            buf.copy_(tensor, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Result(host, event)


class Deferred(Background):
    """The CPU stand-in for a GPU that runs the work later: the work runs only when its result is read."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, overlap=False)
        self.submitted = 0

    def submit(self, work: Callable[[], Sequence[Tensor]]) -> Result:
        self.submitted += 1
        return Result([], work=work)
