"""``cancel`` of a local run whose launcher died ends the processes its ``ranks`` line names (issue 28 item 1) — and
only those: the line is in a shared run directory, so a planted one (pid 0, this process's own group, a process of
another run) must signal nothing. Real processes and signals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from hpc_train.runs import liveness, rundir


def _plant(run_dir, ranks):
    (run_dir / rundir.STATE_LOG).write_text(json.dumps({"event": rundir.RANKS_EVENT, "ranks": ranks}) + "\n")


def _sleeper(env_run_dir):
    env = {**os.environ, rundir.RUN_DIR_ENV: str(env_run_dir)}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)


def test_a_planted_ranks_line_signals_nothing(tmp_path):
    other = _sleeper(tmp_path / "another-run")  # a process of another run, in a group of its own
    try:
        me = os.getpid()
        _plant(tmp_path, [[0, 0, 0], [1, 1, 1], [2, os.getpgrp(), liveness.start_ticks(me)],
                          [3, other.pid, liveness.start_ticks(other.pid)]])
        assert liveness.orphans(tmp_path) == []
        assert liveness.end_orphans(tmp_path, wait_s=0.5) == []
        time.sleep(0.2)
        assert other.poll() is None  # still running: not this run's
    finally:
        other.kill()
        other.wait()


def test_the_runs_own_left_processes_are_ended(tmp_path):
    rank = _sleeper(tmp_path)
    try:
        _plant(tmp_path, [[0, rank.pid, liveness.start_ticks(rank.pid)]])
        assert liveness.orphans(tmp_path) == [rank.pid]
        assert liveness.end_orphans(tmp_path, wait_s=2) == [rank.pid]
        assert rank.wait(timeout=10) != 0
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
