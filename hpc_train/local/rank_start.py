"""``python -m hpc_train.local.rank_start LAUNCHER_PID -- ARGV...``: how the local launcher starts a rank. Torch-free,
stdlib only.

The rank must die with the launcher's thread that started it (a parent-death signal, so a SIGKILLed launcher leaves
no rank behind). ``prctl(PR_SET_PDEATHSIG)`` has to run in the child, after the fork; doing it in a ``preexec_fn``
runs Python code between fork and exec in a copy of a launcher whose other threads (every launch of ``--pack``, the
waiters, the watchdog) may hold locks at that moment, which Python's documentation calls unsafe. So the launcher
forks with no Python code in the child (``subprocess`` then uses vfork/exec; ``process_group=0`` is done in C) and
execs this small program, which sets the signal, checks that the launcher is still its parent (a launcher that died
before the signal was set is not seen by it: then the rank leaves at once) and execs the rank: same pid, same
process group, the parent-death signal kept across exec.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 128 + signal.SIGKILL
"""What a rank whose launcher had already died returns: what the parent-death signal would have made it."""


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL from the kernel when the thread that forked this process ends; leave at once if it already has."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(EXIT_PARENT_GONE)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "--":
        print("usage: python -m hpc_train.local.rank_start LAUNCHER_PID -- ARGV...", file=sys.stderr)
        return 2
    die_with_parent(int(argv[0]))
    try:
        os.execvp(argv[2], argv[2:])  # replaces this process: the rank keeps its pid, group and parent-death signal
    except OSError as exc:  # what a shell says and returns for a program it cannot run
        print(f"hpc-train: cannot start the rank: {argv[2]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
