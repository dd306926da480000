"""What the local launcher's watchdog (``slurm.hang_timeout_s``, ``slurm.hang_action``) does to hung ranks once no
rank has advanced for the timeout (:class:`hpc_train.runs.liveness.Watch` decides that). Torch-free.

In order: the ranks are probed (:func:`hpc_train.runs.liveness.probe_ranks`: process states, stack dumps, py-spy),
the ranks that stopped first are named with their host, their stacks are copied into the batch log, and then every
rank's process group is killed, so nothing is left behind. The batch script's watchdog
(:mod:`hpc_train.slurm.watchdog`) does the same across nodes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..runs import liveness


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


def on_hang(procs: Sequence[subprocess.Popen], watch: liveness.Watch, log_of: Callable[[int], Path],
            say: Callable[[str], Any]) -> str:
    """Dump, name, end (see the module docstring); returns the reason the run is recorded with."""
    now = time.monotonic()
    ended = [rank for rank, proc in enumerate(procs) if proc.poll() is not None]
    live = {rank: proc.pid for rank, proc in enumerate(procs) if rank not in ended}
    probes = liveness.probe_ranks(live, log_of)
    ranks = liveness.suspects(probes, watch, ended)
    host = socket.gethostname()
    reason = liveness.hang_reason(ranks, watch, probes, now, {r: host for r in live})
    say(reason)
    for line in liveness.stack_lines(probes):
        say(line)
    kill_groups(procs)
    say("ended every rank (SIGKILL to each rank's process group)")
    return reason
