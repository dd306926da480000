"""Shared pieces of the benchmarks: timing, medians, the machine record, CIFAR-shaped data, workers.

Every benchmark compares ours with a reference *in the same run*, interleaved round by round (ABBA
order, so a slow drift in the machine's load hits both sides alike) and reports medians: the machine
this runs on is shared, and only ratios measured side by side survive that.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
CIFAR10_LT_IF100_TRAIN_IMAGES = 12_406
"""CIFAR-10-LT at imbalance factor 100 (LDAM-DRW's construction): what one epoch of the recipe sees."""


# --------------------------------------------------------------------------------------------------
# Statistics and interleaving
# --------------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the relative spread (max - min) / median: how noisy a figure was."""
    med = median(values)
    return {"median": med, "min": float(min(values)), "max": float(max(values)), "n": len(values),
            "rel_spread": float((max(values) - min(values)) / med) if med else 0.0}


def abba_order(names: Sequence[str], rounds: int) -> list[list[str]]:
    """Round r runs the names forwards when r is even and backwards when odd (A B, B A, A B, ...)."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def interleave(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Call every run once per round in ABBA order; returns each run's values in call order."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for order in abba_order(list(runs), rounds):
        for name in order:
            out[name].append(runs[name]())
    return out


# --------------------------------------------------------------------------------------------------
# Machine, memory, processes
# --------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_info() -> dict[str, Any]:
    import torch
    import torchvision

    return {
        "host": socket.gethostname(), "cpu": cpu_model(), "usable_cores": usable_cores(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
        "torch_threads": torch.get_num_threads(), "cuda_available": torch.cuda.is_available(),
        "platform": platform.platform(), "load_avg_1min_at_start": os.getloadavg()[0],
    }


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size of this process (or of its largest waited-for child), MiB."""
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


def _pss_kb(pid: int | str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children(pid: int) -> list[str]:
    out: list[str] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += (task / "children").read_text().split()
    except OSError:
        pass
    return out


class PssSampler:
    """Peak proportional set size of this process plus its child processes (DataLoader workers),
    sampled every ``interval_s`` in a thread. PSS splits pages shared copy-on-write between a parent and
    its forked workers, so the sum counts each page once — unlike adding up the processes' RSS."""

    def __init__(self, interval_s: float = 0.5) -> None:
        import threading

        self.interval_s, self.peak_mb = interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> float:
        pid = os.getpid()
        total_kb = _pss_kb(pid) + sum(_pss_kb(child) for child in _children(pid))
        self.peak_mb = max(self.peak_mb, total_kb / 1024.0)
        return total_kb / 1024.0

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "PssSampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """Environment of a benchmark subprocess: no launcher variables leaking in, the repository importable,
    no site file (built-in defaults only)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_")) and k not in (
               "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GROUP_RANK", "NODE_RANK", "HPC_TRAIN_RUN_DIR", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Worker:
    """A long-lived benchmark subprocess driven by JSON lines: the parent writes a command, the worker
    answers one JSON object per command. Start-up (torch import, data, model, warm-up) is paid once, and
    two workers take turns, so neither competes with the other for the cores while it is timed."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([PYTHON, *args], cwd=REPO, env=env or child_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                where = f"; see {self.log.name}" if hasattr(self.log, "name") else ""
                raise RuntimeError(f"benchmark worker {self.proc.args} exited with {code}{where}")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> dict[str, Any]:
        try:
            return self.ask({"cmd": "quit"})
        finally:
            self.proc.wait(timeout=60)
            if hasattr(self.log, "close"):
                self.log.close()


def serve(handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]], ready: dict[str, Any]) -> None:
    """The worker side of :class:`Worker`: say ``ready`` (what the set-up was), then answer commands
    from stdin until ``quit``."""
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints (the reference loop's log lines) must not corrupt the protocol
    print(json.dumps({"ready": True, **ready}), file=out, flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        name = command["cmd"]
        if name == "quit":
            print(json.dumps(handlers["quit"](command) if "quit" in handlers else {}), file=out, flush=True)
            return
        print(json.dumps(handlers[name](command)), file=out, flush=True)


# --------------------------------------------------------------------------------------------------
# CIFAR-shaped long-tailed data
# --------------------------------------------------------------------------------------------------


def cifar_lt_counts(max_per_class: int, num_classes: int = 10, imbalance_factor: float = 100.0) -> list[int]:
    from hpc_train.train.data.datasets import longtail_counts

    return longtail_counts(max_per_class, num_classes, imbalance_factor)


def cifar_shaped_lt(max_per_class: int = 5000, *, num_classes: int = 10, imbalance_factor: float = 100.0,
                    test_per_class: int = 100, seed: int = 0, multiple_of: int = 1):
    """A CIFAR-shaped long-tailed data set (uint8 3×32×32, LDAM-DRW's class counts; at 5,000 per class
    and IF 100: CIFAR-10-LT's 12,406 training images), in the ``DataSource`` form our trainer takes.

    The pixels are random (class-tinted, so a model has something to fit): speed does not depend on
    them, and drawing them takes a fraction of a second, unlike the project's ``synthetic-lt`` set.
    ``multiple_of`` adds images to the head class until the total divides by it (whole batches only).
    """
    import numpy as np

    from hpc_train.train.data.datasets import ArraySplit, DataSource

    rng = np.random.default_rng(seed)
    tint = rng.integers(0, 96, size=(num_classes, 3, 1, 1), dtype=np.uint8)

    def split(per_class: Sequence[int]) -> ArraySplit:
        labels = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)
        images = rng.integers(0, 160, size=(len(labels), 3, 32, 32), dtype=np.uint8)
        images += tint[labels]
        return ArraySplit(images, labels)

    counts = cifar_lt_counts(max_per_class, num_classes, imbalance_factor)
    counts[0] += -sum(counts) % multiple_of
    train = split(counts)
    test = split([test_per_class] * num_classes)
    return DataSource("cifar-shaped-lt", num_classes, train, test, None, CIFAR_MEAN, CIFAR_STD, 3, 32,
                      [str(i) for i in range(num_classes)])


def timer() -> Callable[[], float]:
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
