"""``python -m hpc_train.local.guard RUN_DIR INSTANCE RESTART LAUNCHER_PID``: what ends a launch's ranks when its
launcher dies without ending them (SIGKILL, a crash), as slurmd ends a step whose slurmstepd died. Torch-free.

The launcher starts one guard per launch with a pipe as its stdin and writes it one line per rank, ``RANK PID
START_TICKS`` (each rank leads a process group of its own). When the launch ends as it should, the launcher writes
``done`` and the guard leaves. When the pipe closes without ``done``, the launcher died: the guard sends SIGTERM to
every rank's process group (the rank, its data workers, a command's own children), SIGKILL after
:data:`KILL_WAIT_S`, and records in the run's state log that the run failed, naming the launcher and its ranks.

The ranks also get SIGKILL from the kernel when the launcher's thread that started them dies (a parent-death
signal, :mod:`hpc_train.local.rank_start`); that reaches the rank process only, not its children,
and records nothing: the guard does both.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ..runs import liveness, rundir

DONE = "done"
KILL_WAIT_S = 5.0
"""After SIGTERM, how long the ranks' processes get before SIGKILL (the launcher's KillWait)."""


def read_ranks(lines: list[str]) -> tuple[list[liveness.RankProcess], bool]:
    """The ranks the launcher announced, and whether it said ``done``."""
    ranks, done = [], False
    for line in lines:
        words = line.split()
        if words == [DONE]:
            done = True
        elif len(words) == 3 and all(w.isdigit() for w in words):
            ranks.append(liveness.RankProcess(rank=int(words[0]), pid=int(words[1]), start_ticks=int(words[2])))
    return ranks, done


def main(argv: list[str]) -> int:
    for name in ("SIGINT", "SIGHUP"):  # a terminal's signals are the launcher's to act on, not the guard's
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    run_dir, instance, restart, launcher_pid = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    ranks, done = read_ranks(sys.stdin.read().splitlines())  # until the launcher closes the pipe: ends or dies
    if done:
        return 0
    alive = liveness.end_groups(ranks, KILL_WAIT_S)
    pids = ", ".join(f"rank {r.rank} pid {r.pid}" for r in ranks) or "none started"
    ended = f"its guard ended {len(alive)} process(es) still running" if alive else "no process of them was left"
    reason = (f"the local launcher (pid {launcher_pid}) died before its ranks ended ({pids}); {ended} "
              "(SIGTERM, SIGKILL after 5 s)")
    rundir.append_event(run_dir, rundir.FAILED, writer="launcher guard", instance=instance, restart=restart,
                        reason=reason)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
