"""Whether a run is alive and advancing: its local runner's process, the ranks' progress heartbeats
(:mod:`hpc_train.rank.heartbeat` writes them), and the hang probing both watchdogs share — each rank's process
state, the stack-dump signal, and naming the rank that stopped first. The local launcher's watchdog
(:mod:`hpc_train.local.hang_actions`), the batch script's (:mod:`hpc_train.slurm.watchdog`) and
``hpc-train status`` read it. Torch-free, stdlib only.

*Advancing* is a new beat in a rank's record. The watchdog times it on its own clock (the moment it first saw
each beat), so the nodes' clocks never matter to it; ``status``, which looks once, reads the records' wall times.

When the watchdog fires: each rank's process state is read (a stopped process cannot dump its stacks, so it is
named by its state: ``rank 1 stopped (state T)``); every rank that can still run is sent :data:`DUMP_SIGNAL`
(faulthandler, registered by the rank) and, when py-spy is installed, dumped by py-spy too; the stacks land in
the rank logs, and the ranks that stopped first are named with their host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import rundir, safe_files

RUNNER_MODULE = "hpc_train.local"
"""The local runner a local run's ``launcher_pid`` runs (``python -m hpc_train.local PLAN``)."""
PROGRESS_FILE = "ranks/rank-{rank}.progress"
"""A rank's heartbeat record, under its run directory (written by :mod:`hpc_train.rank.heartbeat`)."""
DUMP_SIGNAL = signal.SIGURG
"""The stack-dump signal: the ranks register faulthandler on it (ignored by default, used neither by the
preemption contract nor by NCCL), the watchdogs send it."""
DUMP_WAIT_S = 2.0
"""How long the ranks get to write their stacks before they are ended."""
PY_SPY_TIMEOUT_S = 20.0
PROGRESS_GLOB = "rank-*.progress"
STALL_CAP_S = 300.0
DONE_PHASES = frozenset({"done"})


# --------------------------------------------------------------------------------------------------
# A local run's runner process
# --------------------------------------------------------------------------------------------------

def is_alive(pid: int) -> bool:
    """The local runner with this pid still runs (a reused pid running something else does not count;
    the first milliseconds, before the runner's exec, it is still the submitting hpc-train)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):  # ended, not yet reaped (the submitting hpc-train is its parent)
        return False
    if not cmdline:  # between fork and exec
        return True
    return any(name in cmdline for name in (RUNNER_MODULE.encode(), b"hpc-train", b"hpc_train.cli",
                                            b"hpc_train.train"))  # the last: `python -m hpc_train.train` alone


# --------------------------------------------------------------------------------------------------
# A local launch's ranks: each leads a process group of its own, recorded in the state log
# --------------------------------------------------------------------------------------------------

RANKS_EVENT = rundir.RANKS_EVENT


@dataclass(frozen=True)
class RankProcess:
    """A rank's process, told apart from a later process that got the same pid by its start time."""

    rank: int
    pid: int
    start_ticks: int
    """Field 22 of ``/proc/PID/stat``: when the process started, in clock ticks since boot."""


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (field 3 on), or None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot); 0 once it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else 0


def group_members(rank: RankProcess) -> list[int]:
    """The live processes of the rank's process group (the rank, its data workers, a command's children): those
    whose group is the rank's pid and that started no earlier than the rank (not a later owner of the number)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if not fields or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == rank.pid and int(fields[19]) >= rank.start_ticks:  # its group, started after it
            members.append(int(entry.name))
    return sorted(members)


def signal_groups(ranks: Sequence[RankProcess], signum: int) -> None:
    """``signum`` to every rank's process group that still has members."""
    for rank in ranks:
        if group_members(rank):
            try:
                os.killpg(rank.pid, signum)
            except OSError:
                pass  # ended meanwhile


def launched_ranks(events: Sequence[Mapping[str, Any]]) -> list[RankProcess]:
    """The ranks the last local launch recorded (its :data:`RANKS_EVENT` line); none before any."""
    for event in reversed(events):
        if event.get("event") == RANKS_EVENT:
            try:
                ranks = [RankProcess(int(r), int(p), int(t)) for r, p, t in event.get("ranks") or []]
            except (TypeError, ValueError):
                return []
            # pid 0 or 1, or no start time, would match init, kernel threads or any group: a planted line, not ranks
            return [rank for rank in ranks if rank.pid > 1 and rank.start_ticks > 0]
    return []


def orphans(run_dir: Path) -> list[int]:
    """Processes of the last local launch's ranks that still run (after its launcher died, nothing should): members
    of the recorded ranks' process groups that are this user's and carry this run directory in their environment
    (the ``ranks`` line is in a shared directory: what it names is checked before anything is signalled)."""
    return [pid for rank in launched_ranks(rundir.read_events(Path(run_dir))) for pid in group_members(rank)
            if _of_run(pid, Path(run_dir))]


def _of_run(pid: int, run_dir: Path) -> bool:
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    prefix = f"{rundir.RUN_DIR_ENV}=".encode()
    recorded = [entry[len(prefix):].decode(errors="replace") for entry in environ if entry.startswith(prefix)]
    return any(os.path.realpath(value) == os.path.realpath(run_dir) for value in recorded)


def end_groups(ranks: Sequence[RankProcess], wait_s: float = 5.0) -> list[int]:
    """SIGTERM to the ranks' process groups, SIGKILL after ``wait_s`` (KillWait); the pids that were alive."""
    alive = [pid for rank in ranks for pid in group_members(rank)]
    signal_groups(ranks, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(group_members(r) for r in ranks):
        time.sleep(0.1)
    signal_groups(ranks, signal.SIGKILL)
    return alive


def end_orphans(run_dir: Path, wait_s: float = 5.0) -> list[int]:
    """``cancel`` of a run whose launcher died while its ranks ran: SIGTERM to each of its :func:`orphans`, SIGKILL
    after ``wait_s`` (KillWait) to those left; the pids that were alive. Process by process, never a whole group: a
    group may hold processes that are not the run's."""
    alive = orphans(run_dir)
    _signal_pids(alive, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and orphans(run_dir):
        time.sleep(0.1)
    _signal_pids(orphans(run_dir), signal.SIGKILL)
    return alive


def run_process(pid: int, run_dir: Path) -> bool:
    """``pid`` is a process of this run: this user's, carrying the run directory in its environment (a pid read
    from a shared directory names what may be signalled only after this check)."""
    return pid > 1 and _of_run(pid, Path(run_dir))


def end_process(pid: int, run_dir: Path, wait_s: float) -> bool:
    """``cancel`` of a run that is one process (``train`` run alone): SIGTERM (it checkpoints), SIGKILL after
    ``wait_s`` if it is still this run's; True when it ended within ``wait_s`` by itself."""
    if not run_process(pid, run_dir):
        return True
    _signal_pids([pid], signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and is_alive(pid):
        time.sleep(0.1)
    if is_alive(pid) and run_process(pid, run_dir):
        _signal_pids([pid], signal.SIGKILL)
        return False
    return True


def _signal_pids(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass  # ended meanwhile


# --------------------------------------------------------------------------------------------------
# Heartbeats: whether the ranks advance
# --------------------------------------------------------------------------------------------------


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
            beat = _beat(safe_files.read_json(path))
        except (OSError, ValueError, safe_files.RunFileError):
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


# --------------------------------------------------------------------------------------------------
# Probing a hang: process states, stack dumps, the rank that stopped first
# --------------------------------------------------------------------------------------------------

def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T stopped, t traced, Z); ``gone`` when it has ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def stopped(state: str) -> bool:
    return state in ("T", "t")


def py_spy_dump(pid: int) -> str | None:
    """``py-spy dump --nonblocking`` of ``pid`` when py-spy is on PATH (it reads a stopped process too)."""
    tool = shutil.which("py-spy")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=PY_SPY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy dump failed: {exc}"
    return (out.stdout + out.stderr).strip()


@dataclass(frozen=True)
class Probe:
    """What one rank's process showed when the watchdog fired."""

    rank: int
    host: str
    pid: int
    state: str
    stacks: str = ""
    """Its faulthandler dump (what it wrote to its log after the signal), empty when it could not dump."""
    py_spy: str | None = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return ""


def probe_ranks(pids: Mapping[int, int], log_of: Callable[[int], Path], host: str | None = None) -> list[Probe]:
    """State, stack dump and py-spy dump of each rank (``pids``: rank → pid on this host; ``log_of``: its log)."""
    host = host or socket.gethostname()
    states = {rank: process_state(pid) for rank, pid in pids.items()}
    offsets = {rank: _size(log_of(rank)) for rank in pids}
    for rank, pid in pids.items():
        if states[rank] not in ("gone", "Z") and not stopped(states[rank]):
            try:
                os.kill(pid, DUMP_SIGNAL)
            except OSError:
                pass
    spied = {rank: py_spy_dump(pid) for rank, pid in pids.items() if states[rank] not in ("gone", "Z")}
    time.sleep(DUMP_WAIT_S)
    return [Probe(rank, host, pid, states[rank], _read_from(log_of(rank), offsets[rank]), spied.get(rank))
            for rank, pid in pids.items()]


def suspects(probes: Sequence[Probe], watch: Watch, ended: Sequence[int] = ()) -> list[int]:
    """The ranks that stopped first: stopped processes; else those busy outside a collective while the others
    wait in one; else the least progress, oldest beat (:meth:`Watch.stopped_first`)."""
    frozen = [p.rank for p in probes if stopped(p.state)]
    if frozen:
        return sorted(frozen)
    busy = [p.rank for p in probes if p.stacks and busy_elsewhere(p.stacks)]
    if busy and len(busy) < len(probes):
        return sorted(busy)
    return watch.stopped_first(ended)


def hang_reason(ranks: Sequence[int], watch: Watch, probes: Sequence[Probe], now: float,
                hosts: Mapping[int, str]) -> str:
    """``hung: rank 3 on gpu07 made no progress for 900 s (last: epoch 12, step 40); rank 3 stopped (state T)``."""
    first = ranks[0]
    beat = watch.beats.get(first)

    def host(rank: int) -> str:
        return hosts.get(rank) or (watch.beats[rank].host if rank in watch.beats else "?")

    who = f"rank {first} on {host(first)}"
    if len(ranks) > 1:
        who = "ranks " + ", ".join(f"{r} on {host(r)}" for r in ranks)
    last = f" (last: {beat.where()})" if beat else " (no heartbeat yet)"
    text = f"hung: {who} made no progress for {watch.silent_s(first, now):.0f} s{last}"
    states = [f"rank {p.rank} stopped (state {p.state})" for p in probes if stopped(p.state)]
    gone = [f"rank {p.rank} unreachable ({p.state})" for p in probes if p.state in ("gone", "unreachable")]
    return "; ".join([text, *states, *gone])


def stack_lines(probes: Sequence[Probe]) -> list[str]:
    """The batch log's copy of what each rank showed (its stacks, or why it has none)."""
    lines: list[str] = []
    for p in probes:
        if stopped(p.state):
            lines.append(f"rank {p.rank} on {p.host} (pid {p.pid}): stopped (state {p.state}), cannot dump its stacks")
        elif p.stacks.strip():
            lines.append(f"rank {p.rank} on {p.host} (pid {p.pid}), state {p.state}: its Python stacks:")
            lines.extend("    " + line for line in p.stacks.strip().splitlines())
        else:
            lines.append(f"rank {p.rank} on {p.host} (pid {p.pid}), state {p.state}: wrote no stacks")
        if p.py_spy:
            lines.append(f"rank {p.rank}: py-spy dump:")
            lines.extend("    " + line for line in p.py_spy.splitlines())
    return lines
