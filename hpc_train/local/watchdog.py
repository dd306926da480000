"""The local launcher's watchdog (``slurm.hang_timeout_s``, ``slurm.hang_action``): what it does once no rank has
advanced for the timeout (:class:`hpc_train.runs.heartbeats.Watch` decides that). Torch-free.

In order: each rank's process state is read (a stopped process cannot dump its stacks, so it is named by its
state: ``rank 1 stopped (state T)``); every rank that can still run is sent the stack-dump signal (faulthandler,
registered by the rank: :mod:`hpc_train.rank.heartbeat`) and, when py-spy is installed, dumped by py-spy too;
the stacks land in the rank logs and are copied into the batch log; the ranks that stopped first are named with
their host; then every rank's process group is killed, so nothing is left behind. The batch script's watchdog
(:mod:`hpc_train.slurm.watchdog`) does the same across nodes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..rank.heartbeat import DUMP_SIGNAL
from ..runs import heartbeats

DUMP_WAIT_S = 2.0
"""How long the ranks get to write their stacks before they are ended."""
PY_SPY_TIMEOUT_S = 20.0


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


def suspects(probes: Sequence[Probe], watch: heartbeats.Watch, ended: Sequence[int] = ()) -> list[int]:
    """The ranks that stopped first: stopped processes; else those busy outside a collective while the others
    wait in one; else the least progress, oldest beat (:meth:`~hpc_train.runs.heartbeats.Watch.stopped_first`)."""
    frozen = [p.rank for p in probes if stopped(p.state)]
    if frozen:
        return sorted(frozen)
    busy = [p.rank for p in probes if p.stacks and heartbeats.busy_elsewhere(p.stacks)]
    if busy and len(busy) < len(probes):
        return sorted(busy)
    return watch.stopped_first(ended)


def hang_reason(ranks: Sequence[int], watch: heartbeats.Watch, probes: Sequence[Probe], now: float,
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


def kill_groups(procs: Sequence[subprocess.Popen]) -> None:
    """SIGKILL every rank's process group (its data workers too): a hung or stopped rank ignores SIGTERM."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            try:
                proc.kill()
            except OSError:
                pass
    for proc in procs:
        proc.wait()


def on_hang(procs: Sequence[subprocess.Popen], watch: heartbeats.Watch, log_of: Callable[[int], Path],
            say: Callable[[str], Any]) -> str:
    """Dump, name, end (see the module docstring); returns the reason the run is recorded with."""
    now = time.monotonic()
    ended = [rank for rank, proc in enumerate(procs) if proc.poll() is not None]
    live = {rank: proc.pid for rank, proc in enumerate(procs) if rank not in ended}
    probes = probe_ranks(live, log_of)
    ranks = suspects(probes, watch, ended)
    host = socket.gethostname()
    reason = hang_reason(ranks, watch, probes, now, {r: host for r in live})
    say(reason)
    for line in stack_lines(probes):
        say(line)
    kill_groups(procs)
    say("ended every rank (SIGKILL to each rank's process group)")
    return reason
