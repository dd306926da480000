"""CUDA graphs of the whole training step, and torch.compile's cache and graph count (the step compiles its
module: :func:`~.step.compile_module`).

Following PyTorch's CUDA-semantics notes on whole-network capture: every batch shape of a phase (the
full global batch, and the epoch's short last one) gets its own graph. A shape's first occurrences
(:func:`warmup_steps`: one at world size 1, three with several ranks) run eagerly on a side stream — they are
real steps of the run, and they do the lazy work a capture must not meet (cuBLAS/cuDNN handles and
workspaces, ``cudnn.benchmark``'s search, the optimizer's momentum buffers, compilation under ``compile:
true``) — then the next occurrence is captured on that same stream and replayed from then on (at world size 1
the short last batch is captured in the second epoch); capture itself runs nothing, so the captured step is
replayed once right away. The step reads everything that changes through
device tensors updated in place (:mod:`.step`), so a replay needs no input from the host. Whatever
reassigns what a graph read (a new classifier and optimizer at cRT) starts a new :class:`CapturedSteps`.

A capture that raises falls back to eager steps for the rest of the run, with one log line; with several
ranks the ranks agree first, so all replay or none does. Captured collectives (the gradient all-reduce,
buffer broadcasts, SyncBatchNorm at world size > 1) need NCCL >= 2.9.6 and every rank replaying the
same graphs: written to PyTorch's rules, **not verified on GPUs** (NCCL refuses two ranks on one GPU),
hence ``cuda_graphs: auto`` leaves them off.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch

from ...config import TrainConfig
from ...config.plugins import in_use as plugins_in_use
from .guard import NoHostSync
from .step import TrainStep

log = logging.getLogger("hpc_train.train")

WARMUP_STEPS = 3
"""Eager steps per batch shape before its capture with several ranks (PyTorch's example warms up with 3; DDP's
notes ask for several before a capture)."""


def capture_check_required(cfg: TrainConfig) -> list[str]:
    """The plug-ins whose step is not known to be capture-safe: a plug-in model or loss. The captured step runs
    them only after its capture check passed (their warm-up steps run under a recording host-sync guard, and a
    value read back to the host there keeps the run eager, with one log line)."""
    return [f"{kind} {name}" for kind, (name, _) in plugins_in_use(cfg).items() if kind in ("model", "loss")]


def warmup_steps(world_size: int) -> int:
    """Eager steps per batch shape before its capture: one at world size 1 (its lazy work is all done by the
    first step; every extra eager step is set-up time), :data:`WARMUP_STEPS` with several ranks."""
    return 1 if world_size == 1 else WARMUP_STEPS


def decide(cfg: TrainConfig, device: torch.device, *, world_size: int, in_memory: bool) -> tuple[bool, str]:
    """(capture?, why) — the same answer on every rank: it depends on the configuration only."""
    setting = cfg.cuda_graphs
    if setting is False:
        return False, "cuda_graphs: off"
    blockers = [why for bad, why in (
        (device.type != "cuda", f"the device is {device.type}"),
        (not in_memory, "the data set streams batches from the host (DataLoader)"),
        (cfg.amp == "fp16", "amp fp16's gradient scaler is not captured (bf16 is)"),
        (cfg.strategy == "dp", "strategy dp runs DataParallel"),
        (setting == "auto" and world_size > 1,
         f"world size {world_size}: captured NCCL collectives are unverified on GPUs (cuda_graphs: on tries them)"),
    ) if bad]
    if blockers:
        return False, f"cuda_graphs: {'on' if setting is True else 'auto'}, off because " + "; ".join(blockers)
    return True, f"cuda_graphs: {'on' if setting is True else 'auto'}, one graph per batch shape"


def set_compile_cache(cfg: TrainConfig) -> str | None:
    """Point inductor's persistent cache (FX graphs, AOTAutograd, Triton kernels) at
    ``compile_cache_dir`` unless the environment already does; returns the directory in use."""
    if cfg.compile_cache_dir and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        path = Path(os.path.expandvars(cfg.compile_cache_dir)).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def compiled_graphs() -> int:
    """Graphs Dynamo compiled in this process so far."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - every torch 2 has it
        return 0
    return int(counters["stats"]["unique_graphs"])


class CudaGraphs:
    """The CUDA side of :class:`CapturedSteps` (tests stand a recording fake in for it on the CPU)."""

    def stream(self, device: torch.device):
        return torch.cuda.Stream(device)

    def current(self, device: torch.device):
        return torch.cuda.current_stream(device)

    def on(self, stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def capture(self, body: Callable[[], None], stream):
        """A graph of ``body`` captured on ``stream`` (nothing runs). ``thread_local``: a checkpoint
        writer thread's CUDA calls are not this capture's business."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            body()
        return graph


BACKEND = CudaGraphs()


class CapturedSteps:
    """Runs a :class:`~.step.TrainStep` by batch shape: warm-up, capture, replay (module docstring).
    ``agree(ok) -> bool`` makes a capture's outcome the same on every rank (all must succeed);
    ``before_capture`` runs first (the checkpoint writer is joined: no other thread's CUDA calls while
    a graph is captured)."""

    def __init__(self, step: TrainStep, device: torch.device, *, agree: Callable[[bool], bool],
                 before_capture: Callable[[], None] = lambda: None, backend: CudaGraphs | None = None,
                 check: str | None = None, warmup: int = WARMUP_STEPS) -> None:
        self.step, self.device, self.agree, self.before_capture = step, device, agree, before_capture
        self.warmup = warmup
        """Eager steps per batch shape before its capture (:func:`warmup_steps`)."""
        self.backend = backend or BACKEND
        self.check = check
        """Code not known to be capture-safe (plug-ins, e.g. ``model mylab.models:build``): its warm-up steps
        run under a recording :class:`~.guard.NoHostSync`, and a host read there keeps the run eager."""
        self._host_reads: list[str] = []
        self.stream = self.backend.stream(device)
        self.graphs: dict[str, Any] = {}
        self.seen: Counter[str] = Counter()
        self.replays: Counter[str] = Counter()
        self.failed: str | None = None

    def run(self, kind: str) -> None:
        if self.failed is not None:
            self.step.body(kind)
            return
        graph = self.graphs.get(kind)
        if graph is not None:
            graph.replay()
            self.replays[kind] += 1
            return
        current = self.backend.current(self.device)
        if self.seen[kind] < self.warmup:
            self.seen[kind] += 1
            self.stream.wait_stream(current)
            with self.backend.on(self.stream), self._checked():
                self.step.body(kind)
            current.wait_stream(self.stream)
            return
        # Only with a plug-in to check (the same on every rank): otherwise the answer is known, and the
        # agreement would be one more blocking all-reduce per capture.
        if self.check is not None and not self.agree(not self._host_reads):
            self.failed = (f"{self.check} reads values on the host ({self._host_reads[0]})" if self._host_reads
                           else "the capture check failed on another rank")
            self.graphs.clear()  # a graph of another batch shape holds the same plug-in
            log.warning("cuda_graphs: not captured: %s, which a CUDA graph would freeze; training continues with "
                        "eager steps", self.failed)
            self.step.body(kind)
            return
        self._capture(kind, current)

    @contextlib.contextmanager
    def _checked(self):
        """The capture check around a warm-up step (a no-op for hpc-train's own code, checked by the tests)."""
        if self.check is None:
            yield
            return
        with NoHostSync(self.check, record=True) as mode:
            yield
        self._host_reads += mode.seen

    def _capture(self, kind: str, current) -> None:
        self.before_capture()
        graph, error = None, None
        self.step.optimizer.zero_grad(set_to_none=True)  # the graph allocates its gradients itself
        self.stream.wait_stream(current)
        try:
            graph = self.backend.capture(lambda: self.step.body(kind), self.stream)
        except Exception as exc:  # noqa: BLE001 - any failure to capture means: run eagerly
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        current.wait_stream(self.stream)
        if not self.agree(error is None):
            self.failed = error or "a capture failed on another rank"
            self.graphs.clear()
            self.step.optimizer.zero_grad(set_to_none=True)
            log.warning("cuda_graphs: capturing the %s-batch step failed (%s); training continues with eager steps",
                        kind, self.failed)
            self.step.body(kind)  # this step, eagerly (the capture ran nothing)
            return
        self.graphs[kind] = graph
        log.info("cuda_graphs: captured the %s-batch step after %d eager steps", kind, self.warmup)
        graph.replay()
        self.replays[kind] += 1


def graph_facts(captured: bool, reason: str, runner: CapturedSteps | None, *, compiled: bool) -> dict[str, Any]:
    """The run summary's record of CUDA graphs (on, why, which shapes, a fallback) and of compiled graphs."""
    facts: dict[str, Any] = {"cuda_graphs": {"on": captured, "reason": reason,
                                             "captured": sorted(runner.graphs) if runner else [],
                                             "fell_back": runner.failed if runner else None}}
    if compiled:
        facts["compiled_graphs"] = compiled_graphs()
    return facts
