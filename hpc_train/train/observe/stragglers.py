"""Stragglers: each rank's compute time before the gradient all-reduce, a median per epoch, in metrics.jsonl.

Under DDP every rank's *step* takes as long as the slowest (the all-reduce waits for it), so step times cannot
tell which rank is slow. What differs is the time a rank needs before its gradients are ready: from the start
of its model's forward (after DDP's buffer broadcast) to the moment its last gradient bucket is handed to the
all-reduce (a DDP communication hook, which then runs DDP's own all-reduce: the same division by the world size
and sum). The others' wait in the all-reduce is after that moment, so it is not counted.

The times stay in a list on each rank (a clock read per step, no synchronisation); at the epoch end the ranks'
medians are gathered in one all-gather on the ranks' CPU group, and rank 0 appends one record to metrics.jsonl:
``{"record": "rank_compute", "epoch", "global_step", "compute_ms": [per rank], "hosts": [per rank],
"median_ms", "stragglers": [{"rank", "host", "ratio"}]}`` — a straggler is a rank slower than
:data:`STRAGGLER_RATIO` × the median of the ranks. On CUDA the two moments are CUDA events, read at the epoch
end: there the host waits once per epoch for the epoch's GPU work (the one blocking read the lean epoch
boundary keeps at world size > 1: a bubble of the next steps' launch time, no more). Not measured: captured
steps (CUDA graphs replay the whole step), the SAM/ImbSAM step at world size > 1 (its all-reduce is its own,
not DDP's) and world size 1. Synchronised BatchNorm all-reduces inside the forward, so there a slow rank holds the
others' forward up too and the figures narrow.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

STRAGGLER_RATIO = 1.3
RECORD = "rank_compute"


class ComputeTimes:
    """One rank's compute-before-all-reduce times (see the module docstring)."""

    def __init__(self, device: torch.device, group: Any, *, rank: int, world_size: int, host: str) -> None:
        self.cuda = device.type == "cuda"
        self.group, self.rank, self.world_size = group, rank, world_size
        self.times_ms: list[float] = []
        self.events: list[tuple[Any, Any]] = []
        self._start: Any = None
        hosts: list[Any] = [None] * world_size
        dist.all_gather_object(hosts, host, group=group)  # once: where each rank runs
        self.hosts = [str(h) for h in hosts]

    def attach(self, ddp: nn.Module) -> None:
        """Time the steps of ``ddp`` (a DistributedDataParallel): its module's forward starts the clock, the
        last bucket's communication hook stops it."""
        ddp.module.register_forward_pre_hook(self._begin)
        ddp.register_comm_hook(self, _timed_allreduce)

    def __deepcopy__(self, memo: dict) -> ComputeTimes:
        # The model's forward pre-hook holds this object; a copy of the model (the background evaluation's
        # snapshot, observe/overlap.py) shares it instead of copying its process group, which cannot be copied.
        # The copy runs in evaluation mode, where the hook does nothing.
        return self

    def _begin(self, module: nn.Module, _args: Any) -> None:
        if not module.training:
            return
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def _gradients_ready(self) -> None:
        if self._start is None:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.times_ms.append(1000 * (time.perf_counter() - self._start))
        self._start = None

    def epoch_median_ms(self) -> float:
        """This rank's median of the epoch (and the list starts afresh); NaN when no step was timed."""
        for start, end in self.events:
            end.synchronize()
            self.times_ms.append(float(start.elapsed_time(end)))
        self.events.clear()
        value = statistics.median(self.times_ms) if self.times_ms else float("nan")
        self.times_ms.clear()
        return value

    def end_epoch(self, run_dir: Path, *, epoch: int, global_step: int, writer: bool) -> dict[str, Any] | None:
        """Every rank: the epoch's medians gathered (one all-gather); rank 0 (``writer``) records them."""
        box = torch.tensor([self.epoch_median_ms()], dtype=torch.float64)
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world_size)]
        dist.all_gather(gathered, box, group=self.group)
        values = [float(t.item()) for t in gathered]
        if not writer or any(v != v for v in values):  # NaN: an epoch without timed steps (resumed at its end)
            return None
        record = summarise(values, self.hosts, epoch=epoch, global_step=global_step)
        with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        return record


def summarise(compute_ms: list[float], hosts: list[str], *, epoch: int, global_step: int) -> dict[str, Any]:
    median = statistics.median(compute_ms)
    slow = [{"rank": r, "host": hosts[r], "ratio": round(v / median, 2)}
            for r, v in enumerate(compute_ms) if median > 0 and v > STRAGGLER_RATIO * median]
    return {"record": RECORD, "epoch": epoch, "global_step": global_step,
            "compute_ms": [round(v, 3) for v in compute_ms], "hosts": hosts, "median_ms": round(median, 3),
            "stragglers": slow}


def _timed_allreduce(state, bucket):  # unannotated: DDP checks real annotations, and these would be strings
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if bucket.is_last():
        state._gradients_ready()
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # DDP's own: divide by the world size, sum
