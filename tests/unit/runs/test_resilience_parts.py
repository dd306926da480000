"""The parts of issue 18 that need no launch, each against what it reads: the watchdog's rule over heartbeats, the
stack reader, ``status``'s stalled verdict, the straggler rule, GPU-hours from a state log, MaxArraySize from
``scontrol show config``'s text, and the bad-node list. The launches themselves: tests/unit/local/test_hangs_local.py,
tests/real_cluster/test_hangs.py, tests/real_cluster/test_bad_nodes.py."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from hpc_train.rank import heartbeat as hb
from hpc_train.runs import bad_nodes, liveness, rundir
from hpc_train.runs.index import Run
from hpc_train.runs.report import gpus_of, launch_seconds
from hpc_train.runs.status import health
from hpc_train.slurm import client, watchdog

DUMP = '''Thread 0x00007f04aa7fc640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f04d7848b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 625 in backward
  File "/repo/hpc_train/train/loop/step.py", line 182 in _step
  File "/repo/hpc_train/train/__main__.py", line 63 in <module>
  File "<frozen runpy>", line 88 in _run_code
'''


def beat(rank: int, n: int, step: int, phase: str = "train", when: float = 0.0, instance: str = "i") -> liveness.Beat:
    return liveness.Beat(rank=rank, host=f"node{rank}", pid=100 + rank, instance=instance, beat=n, step=step,
                           epoch=1, phase=phase, time=when)


def test_the_watchdog_arms_at_the_first_heartbeat_and_fires_only_when_no_rank_advanced():
    watch = liveness.Watch(world_size=2, timeout_s=30, instance="i")
    assert not watch.hung(now=1000)  # not armed: start-up is never a hang
    watch.update({0: beat(0, 1, 10)}, now=0)
    assert not watch.hung(now=29) and watch.hung(now=30)  # rank 1 never beat: silent since arming
    watch.update({0: beat(0, 2, 20), 1: beat(1, 1, 10)}, now=25)
    assert not watch.hung(now=54) and watch.hung(now=55)
    assert watch.stopped_first() == [1]  # least progress
    watch.update({0: beat(0, 9, 25), 1: beat(1, 1, 10)}, now=40)  # rank 0 still advances: not a hang yet
    assert not watch.hung(now=56) and watch.hung(now=70)
    watch = liveness.Watch(world_size=2, timeout_s=30, instance="i")
    watch.update({0: beat(0, 2, 20), 1: beat(1, 1, 10)}, now=25)
    watch.update({0: beat(0, 3, 20, phase="done")}, now=50)
    assert watch.waiting() == [1] and watch.hung(now=55)
    assert not watch.hung(now=55, ended=[1])  # every rank ended or done: nothing to wait for
    off = liveness.Watch(world_size=1, timeout_s=0, instance="i")
    off.update({0: beat(0, 1, 1)}, now=0)
    assert not off.hung(now=10**6)


def test_the_stack_reader_tells_a_rank_waiting_in_a_collective_from_one_busy_elsewhere():
    frames = liveness.main_thread_frames(DUMP)
    assert frames[0] == ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py", "_engine_run_backward")
    assert liveness.busy_elsewhere(DUMP) is False
    busy = DUMP.replace('"/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward',
                        '"/work/mylab/losses.py", line 12 in blocking_loss')
    assert liveness.busy_elsewhere(busy) is True
    assert liveness.busy_elsewhere("no dump here") is None


def test_heartbeats_are_written_at_most_once_per_interval_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    beat_ = hb.Heartbeat(tmp_path, 3, host="gpu07", interval_s=60)
    assert beat_.beat(step=10, epoch=2) is True and beat_.beat(step=20, epoch=2) is False
    assert beat_.beat(step=30, epoch=2, phase="done", force=True) is True
    (read,) = liveness.read_beats(tmp_path, "slurm:77.1").values()
    assert (read.rank, read.host, read.step, read.beat, read.phase) == (3, "gpu07", 30, 3, "done")
    assert liveness.read_beats(tmp_path, "slurm:77.0") == {}  # an earlier launch's records are not this one's
    assert hb.write_interval_s(900) == 30 and hb.write_interval_s(30) == 1.5 and hb.write_interval_s(0) == 30


def test_status_calls_a_run_stalled_after_a_third_of_the_hang_timeout(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"slurm": {"hang_timeout_s": 30}}))
    now = time.time()
    for rank, age in ((0, 2.0), (1, 12.0)):
        data = {"rank": rank, "host": f"gpu0{rank + 1}", "pid": 1, "instance": "x", "beat": 5, "step": 40, "epoch": 3,
                "phase": "train", "time": now - age}
        (run_dir / "ranks" / f"rank-{rank}.progress").write_text(json.dumps(data))
    run = Run(run_dir, {"cluster": "local"})
    out = health(run, rundir.RUNNING, "")
    assert out["reason"].startswith("stalled (no progress for 12 s, rank 1 on gpu02)")
    assert out["slowest_rank"]["rank"] == 1 and 1.5 < out["last_progress_s"] < 4
    (run_dir / "config.json").write_text(json.dumps({"slurm": {"hang_timeout_s": 900}}))  # threshold 300 s
    assert "reason" not in health(run, rundir.RUNNING, "")
    assert liveness.stall_threshold_s(0) == 300 and liveness.stall_threshold_s(30) == 10


def test_gpu_hours_count_every_launch_of_a_run_requeued_ones_included():
    events = [
        {"event": "queued", "time": "2026-01-01T00:00:00+00:00"},
        {"event": "running", "writer": "launcher", "instance": "slurm:5.0", "time": "2026-01-01T00:00:10+00:00"},
        {"event": "requeued", "writer": "watchdog", "instance": "slurm:5.0", "time": "2026-01-01T00:30:10+00:00"},
        {"event": "running", "writer": "launcher", "instance": "slurm:5.1", "time": "2026-01-01T00:31:00+00:00"},
        {"event": "completed", "writer": "trainer", "instance": "slurm:5.1", "time": "2026-01-01T01:00:00+00:00"},
        {"event": "exit", "writer": "launcher", "instance": "slurm:5.1", "time": "2026-01-01T01:01:00+00:00"},
    ]
    assert launch_seconds(events) == 1800 + 1800
    assert gpus_of({"slurm.nodes": 2, "slurm.gpus_per_node": 4}) == 8 and gpus_of({"slurm.gpus_per_node": 0}) == 0
    assert gpus_of({"slurm.nodes": 1, "slurm.gpus_per_node": 1, "slurm.pack": 2}) == 0.5  # two runs share one GPU


def test_max_array_size_is_read_from_scontrol_show_config(on_stub_path):
    stub_slurm = on_stub_path
    stub_slurm.install("scontrol")
    stub_slurm.answer("scontrol", "ArchiveDir              = /tmp\nMaxArraySize            = 10\nMaxJobCount = 10000\n")
    assert client.max_array_size() == 10
    stub_slurm.answer("scontrol", "MaxJobCount = 10000\n")
    assert client.max_array_size() == client.DEFAULT_MAX_ARRAY_SIZE == 1001


def test_a_node_is_excluded_unless_too_few_would_remain(tmp_path, on_stub_path, monkeypatch):
    stub_slurm = on_stub_path
    stub_slurm.answer("sinfo", "gpu01\ngpu02\ngpu03\n")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "gpu")
    assert watchdog.add_excluded(tmp_path, "gpu02", "hung") is True
    assert bad_nodes.excluded_names(tmp_path) == ["gpu02"]
    assert watchdog.add_excluded(tmp_path, "gpu01", "hung") is False  # one node left for a 2-node job
    assert bad_nodes.excluded_names(tmp_path) == ["gpu02"]
    entry = bad_nodes.excluded(tmp_path)[0]
    assert entry["reason"] == "hung" and entry["node"] == "gpu02"


@pytest.mark.parametrize("ms, named", [([10.0, 10.5, 25.0], [2]), ([10.0, 12.0, 12.9], []), ([5.0, 5.0], [])])
def test_a_rank_slower_than_1_3_times_the_median_is_a_straggler(ms, named):
    torch = pytest.importorskip("torch")  # noqa: F841 - the trainer's module imports torch
    from hpc_train.train.observe.stragglers import summarise

    record = summarise(ms, [f"h{i}" for i in range(len(ms))], epoch=3, global_step=30)
    assert [s["rank"] for s in record["stragglers"]] == named
    assert record["record"] == "rank_compute" and record["median_ms"] == statistics.median(ms)


@pytest.mark.parametrize("args, message", [
    (["--set", "slurm.hang_timeout_s=-1"], "slurm.hang_timeout_s must be 0 (off) or more, got -1"),
    (["--set", "slurm.hang_action=retry"], "slurm.hang_action: must be one of 'fail', 'requeue', got 'retry'"),
    (["--sweep", "train.seed=[" + ",".join(map(str, range(10_001))) + "]"], "10,001 sweep points; a sweep holds at most"),
])
def test_bad_watchdog_keys_and_an_oversized_sweep_are_exit_2_with_nothing_written(tmp_path, args, message):
    from tests.cli_helpers import assert_refused, cli, tree

    result = cli("submit", "digits_lt_demo", "--cluster", "local", *args, cwd=tmp_path,
                 env={**__import__("os").environ, "HPC_TRAIN_STATE_DIR": str(tmp_path / "state")})
    assert_refused(result, message)
    assert tree(tmp_path) == []
