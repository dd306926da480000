"""What the watchdog tests share, locally and on the harness: waiting for a run's heartbeats, stopping a rank, and
following ``status`` from the hang to the run's end (was it ``stalled`` first? how long did the end take?)."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hpc_train.runs import liveness
from hpc_train.runs.liveness import process_state


def wait_for_beats(run_dir: Path, ranks: int, timeout_s: float = 180) -> dict[int, liveness.Beat]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        beats = liveness.read_beats(run_dir)
        if len(beats) >= ranks:
            return beats
        time.sleep(0.3)
    raise AssertionError(f"no heartbeat of every rank in {run_dir} within {timeout_s} s")


def stop_rank(run_dir: Path, rank: int) -> tuple[int, float]:
    """SIGSTOP one rank (by the pid its heartbeat names); (pid, when)."""
    pid = liveness.read_beats(run_dir)[rank].pid
    os.kill(pid, signal.SIGSTOP)
    return pid, time.monotonic()


@dataclass
class Followed:
    states: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds after the hang, state, reason) of every look."""

    def first(self, predicate: Callable[[str, str], bool]) -> float | None:
        return next((t for t, s, r in self.states if predicate(s, r)), None)

    @property
    def end(self) -> tuple[float, str, str]:
        return self.states[-1]


def follow(status: Callable[[], dict], since: float, timeout_s: float, poll_s: float = 1.0) -> Followed:
    """``status`` (a run's --json) every ``poll_s`` until the run has ended (or ``timeout_s``)."""
    seen = Followed()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        row = status()
        seen.states.append((time.monotonic() - since, row["state"], row.get("reason", "")))
        if row["state"] not in ("running", "queued", "requeued"):
            return seen
        time.sleep(poll_s)
    raise AssertionError(f"the run did not end within {timeout_s} s of the hang: {seen.states[-3:]}")


def gone(pids: list[int]) -> list[int]:
    """The pids among ``pids`` that still exist (should be none)."""
    return [pid for pid in pids if process_state(pid) != "gone"]


def record_measurement(name: str, value: dict) -> None:
    """Where a test leaves what it measured (the report quotes it): $HPC_TRAIN_MEASURE_DIR/NAME.json."""
    where = os.environ.get("HPC_TRAIN_MEASURE_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{name}.json").write_text(json.dumps(value, indent=2) + "\n")
    print(f"measured {name}: {json.dumps(value)}")
