"""runs/liveness.py: a local runner's process, and the hang probing both watchdogs share, against real processes
(a stopped one, one that dumps its stacks on the signal) and the ranks' heartbeat records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train.runs import liveness

SLEEPER = "import time; time.sleep(60)"


def _spawn(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", *argv], **kwargs)


def test_the_runner_is_alive_until_it_ends_and_a_reused_pid_does_not_count():
    runner = _spawn(SLEEPER, liveness.RUNNER_MODULE)  # the runner's module on its command line
    stranger = _spawn(SLEEPER)  # the same pid could run anything later: it does not count
    try:
        def seen(pid: int) -> str:
            return f"state {liveness.process_state(pid)}, argv {Path(f'/proc/{pid}/cmdline').read_bytes()!r}"

        # Both have exec'd Python before they are judged: between fork and exec a child has no argv yet.
        deadline = time.monotonic() + 30
        while not all(Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in (runner, stranger)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert liveness.is_alive(runner.pid), seen(runner.pid)
        assert not liveness.is_alive(stranger.pid), seen(stranger.pid)
        runner.kill()
        deadline = time.monotonic() + 30
        while liveness.process_state(runner.pid) not in ("Z", "gone") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not liveness.is_alive(runner.pid), liveness.process_state(runner.pid)  # ended, not yet reaped
        runner.wait()
        assert not liveness.is_alive(runner.pid) and liveness.process_state(runner.pid) == "gone"
    finally:
        for proc in (runner, stranger):
            proc.kill()
            proc.wait()


def _beat(rank: int, step: int) -> liveness.Beat:
    return liveness.Beat(rank=rank, host=f"node{rank}", pid=100 + rank, instance="i", beat=step, step=step, epoch=1,
                         phase="train", time=0.0)


@pytest.mark.timeout(60)
def test_a_stopped_rank_is_named_by_its_state_and_a_running_one_dumps_its_stacks(tmp_path):
    dumping = ("import faulthandler, signal, sys, time; "
               f"faulthandler.register(signal.Signals({int(liveness.DUMP_SIGNAL)}), file=sys.stderr, all_threads=True); "
               "print('ready', flush=True); time.sleep(60)")
    logs = {0: tmp_path / "rank-0.log", 1: tmp_path / "rank-1.log"}
    with open(logs[0], "w") as err0, open(logs[1], "w") as err1:
        running = _spawn(dumping, stdout=subprocess.PIPE, stderr=err0, text=True)
        stopped = _spawn(dumping, stdout=subprocess.PIPE, stderr=err1, text=True)
    try:
        assert running.stdout.readline().strip() == "ready" and stopped.stdout.readline().strip() == "ready"
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not liveness.stopped(liveness.process_state(stopped.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)  # the stop is delivered asynchronously
        probes = liveness.probe_ranks({0: running.pid, 1: stopped.pid}, logs.__getitem__, host="here")
        by_rank = {p.rank: p for p in probes}
        assert liveness.stopped(by_rank[1].state) and by_rank[1].stacks == ""  # never sent the dump signal
        assert "File " in by_rank[0].stacks and not liveness.stopped(by_rank[0].state)
        watch = liveness.Watch(world_size=2, timeout_s=10, instance="i")
        watch.update({0: _beat(0, 5), 1: _beat(1, 5)}, now=0.0)
        assert liveness.suspects(probes, watch) == [1]  # the stopped process, whatever the heartbeats say
        reason = liveness.hang_reason([1], watch, probes, now=12.0, hosts={0: "here", 1: "here"})
        assert reason == "hung: rank 1 on here made no progress for 12 s (last: epoch 1, step 5); rank 1 stopped (state T)"
        lines = liveness.stack_lines(probes)
        assert any("rank 1 on here" in line and "cannot dump its stacks" in line for line in lines)
    finally:
        for proc in (running, stopped):
            proc.kill()
            proc.wait()


def test_without_stopped_processes_the_rank_with_the_least_progress_stopped_first():
    watch = liveness.Watch(world_size=3, timeout_s=10, instance="i")
    watch.update({0: _beat(0, 7), 1: _beat(1, 3), 2: _beat(2, 7)}, now=0.0)
    probes = [liveness.Probe(rank, "here", 100 + rank, "S") for rank in range(3)]  # no stacks: nothing to tell
    assert liveness.suspects(probes, watch) == [1]
    assert liveness.suspects(probes, watch, ended=[1]) == [0, 2]  # a rank that ended is not waited for
