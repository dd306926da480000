"""Reading the ranks' progress heartbeats (:mod:`hpc_train.rank.heartbeat` writes them): whether a run still
advances, since when it does not, and which rank stopped first. The local launcher's watchdog, the batch
script's (:mod:`hpc_train.slurm.watchdog`) and ``hpc-train status`` share it. Torch-free, stdlib only.

*Advancing* is a new beat in a rank's record. The watchdog times it on its own clock (the moment it first saw
each beat), so the nodes' clocks never matter to it; ``status``, which looks once, reads the records' wall times.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import rundir

PROGRESS_GLOB = "rank-*.progress"
STALL_CAP_S = 300.0
DONE_PHASES = frozenset({"done"})


def stall_threshold_s(hang_timeout_s: float) -> float:
    """``status`` calls a running run stalled after this long without progress: a third of the hang timeout, at
    most 5 minutes; 5 minutes when the watchdog is off."""
    return STALL_CAP_S if hang_timeout_s <= 0 else min(STALL_CAP_S, hang_timeout_s / 3)


@dataclass(frozen=True)
class Beat:
    """One rank's last written record."""

    rank: int
    host: str
    pid: int
    instance: str
    beat: int
    step: int
    epoch: int | None
    phase: str
    time: float

    def where(self) -> str:
        """``epoch 12, step 40`` (the trainer's; a command's is its step)."""
        return (f"epoch {self.epoch}, " if self.epoch is not None else "") + f"step {self.step}"


def _beat(data: Mapping[str, Any]) -> Beat | None:
    try:
        return Beat(rank=int(data["rank"]), host=str(data.get("host") or "?"), pid=int(data.get("pid") or 0),
                    instance=str(data.get("instance") or ""), beat=int(data.get("beat") or 0),
                    step=int(data.get("step") or 0),
                    epoch=None if data.get("epoch") is None else int(data["epoch"]),
                    phase=str(data.get("phase") or ""), time=float(data.get("time") or 0.0))
    except (KeyError, TypeError, ValueError):
        return None


def read_beats(run_dir: Path, instance: str | None = None) -> dict[int, Beat]:
    """Every rank's record (of ``instance`` only, when given: a requeued launch does not read the last one's)."""
    found: dict[int, Beat] = {}
    for path in sorted((Path(run_dir) / rundir.RANKS_DIR).glob(PROGRESS_GLOB)):
        try:
            beat = _beat(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # being replaced right now: the next look reads it
        if beat is not None and (instance is None or beat.instance == instance):
            found[beat.rank] = beat
    return found


@dataclass
class Watch:
    """What the watchdog knows: when it first saw each rank's latest beat (its own monotonic clock).

    Armed at the first heartbeat of any rank; from then on a rank without one counts as silent since arming.
    Ranks that ended (``ended``) or wrote their last beat (phase ``done``) are not waited for."""

    world_size: int
    timeout_s: float
    instance: str
    seen: dict[int, tuple[int, float]] = field(default_factory=dict)
    beats: dict[int, Beat] = field(default_factory=dict)
    armed_at: float | None = None

    def update(self, beats: Mapping[int, Beat], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for rank, beat in beats.items():
            if self.seen.get(rank, (None,))[0] != beat.beat:
                self.seen[rank] = (beat.beat, now)
            self.beats[rank] = beat
        if self.armed_at is None and beats:
            self.armed_at = now

    def silent_s(self, rank: int, now: float) -> float:
        assert self.armed_at is not None
        return now - self.seen.get(rank, (None, self.armed_at))[1]

    def waiting(self, ended: Sequence[int] = ()) -> list[int]:
        return [r for r in range(self.world_size) if r not in ended
                and not (r in self.beats and self.beats[r].phase in DONE_PHASES)]

    def hung(self, now: float | None = None, ended: Sequence[int] = ()) -> bool:
        """No rank still running has advanced for ``timeout_s`` (never before arming, never when off)."""
        now = time.monotonic() if now is None else now
        ranks = self.waiting(ended)
        if self.timeout_s <= 0 or self.armed_at is None or not ranks:
            return False
        return min(self.silent_s(r, now) for r in ranks) >= self.timeout_s

    def stopped_first(self, ended: Sequence[int] = ()) -> list[int]:
        """The ranks that stopped first: the least progress, then the oldest last beat (ties: all of them)."""
        ranks = self.waiting(ended)
        key = {r: ((self.beats[r].step, self.seen[r][1]) if r in self.beats else (-1, -1.0)) for r in ranks}
        least = min(key.values())
        return [r for r in ranks if key[r] == least]


@dataclass(frozen=True)
class Stall:
    """``status``'s view: how long since the slowest and the freshest rank advanced (wall clock)."""

    last_progress_s: float
    slowest: Beat
    slowest_s: float


def stall(run_dir: Path, now: float | None = None) -> Stall | None:
    """The current launch's heartbeats as ``status`` reads them once (None without any, or when all are done)."""
    beats = read_beats(run_dir)
    if not beats:
        return None
    instance = max(beats.values(), key=lambda b: b.time).instance  # the newest launch's records only
    mine = [b for b in beats.values() if b.instance == instance]
    live = [b for b in mine if b.phase not in DONE_PHASES]
    if not live:
        return None
    now = time.time() if now is None else now
    slowest = min(live, key=lambda b: (b.time, b.rank))
    return Stall(last_progress_s=max(0.0, now - max(b.time for b in live)), slowest=slowest,
                 slowest_s=max(0.0, now - slowest.time))


# --------------------------------------------------------------------------------------------------
# Stacks: which rank is busy elsewhere while the others wait in a collective
# --------------------------------------------------------------------------------------------------

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line \d+ in (?P<func>\S+)')
WAITING_IN = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/", "/hpc_train/train/loop/control.py",
              "/torch/_tensor.py", "/torch/nn/modules/module.py")
"""Innermost frames of a rank that waits for the others (a collective, DDP's backward, the ranks' agreement)."""


def main_thread_frames(dump: str) -> list[tuple[str, str]]:
    """(file, function) of the main thread's frames in a faulthandler dump, innermost first: the thread whose
    outermost frame is the interpreter's entry (runpy, ``<module>``)."""
    threads: list[list[tuple[str, str]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append((m.group("file"), m.group("func")))
    for frames in threads:
        if frames and any(func == "<module>" or "runpy" in file for file, func in frames[-3:]):
            return frames
    return threads[0] if threads else []


def busy_elsewhere(dump: str) -> bool | None:
    """True when the main thread's innermost frame is outside a collective wait (the rank that holds the others
    up), False when it waits in one, None when the dump shows no main thread."""
    frames = main_thread_frames(dump)
    if not frames:
        return None
    return not any(part in frames[0][0] for part in WAITING_IN)
