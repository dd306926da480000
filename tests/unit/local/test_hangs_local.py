"""The watchdog of the local launcher on real gloo ranks (issue 18): a rank stopped with SIGSTOP and a rank that
blocks forever in a plug-in loss. ``status`` says ``stalled`` before the timeout; then the run is ``failed``
naming the rank and host, the other ranks' stacks (and the blocked rank's own) are in the logs, and no process is
left. With ``hang_action: requeue`` the run is launched again from its last checkpoint and completes. A rank
throttled with SIGSTOP/SIGCONT cycles is named as a straggler. The harness counterparts: tests/real_cluster/test_hangs.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.cli_helpers import cli
from tests.hang_helpers import follow, gone, record_measurement, stop_rank, wait_for_beats

REPO = Path(__file__).resolve().parents[3]
HOST = socket.gethostname()
BLOCKING_LOSS = ["--set", "train.loss.name=tests.scripts.blocking_loss:build",
                 "--set", "train.loss.args={block_at_call: 30, block_rank: 1}"]

pytestmark = pytest.mark.timeout(400)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HPC_TRAIN_STATE_DIR": str(tmp_path / "state"),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def submit(tmp_path: Path, name: str, *args: str) -> Path:
    result = cli("submit", "digits_lt_demo", "--cluster", "local", "--name", name, "--json", "--set", "train.device=cpu",
                 *args, cwd=tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    return Path(json.loads(result.stdout.splitlines()[-1])["run_dir"])


def status(tmp_path: Path, run_dir: Path) -> dict:
    result = cli("status", str(run_dir), "--json", cwd=tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_a_stopped_rank_and_a_blocked_rank_end_their_runs_naming_them(tmp_path):
    stopped_run = submit(tmp_path, "stopped", "--set", "train.epochs=2000", "--set", "slurm.hang_timeout_s=30")
    blocked_run = submit(tmp_path, "blocked", "--set", "train.epochs=2000", "--set", "slurm.hang_timeout_s=10",
                         *BLOCKING_LOSS)
    requeued_run = submit(tmp_path, "requeued", "--set", "train.epochs=12", "--set", "slurm.hang_timeout_s=10",
                          "--set", "slurm.hang_action=requeue", "--set", "train.loss.name=tests.scripts.blocking_loss:build",
                          "--set", "train.loss.args={block_at_call: 30, block_rank: 1, first_launch_only: true}")
    beats = wait_for_beats(stopped_run, 2)
    pids = [beats[0].pid, beats[1].pid]
    time.sleep(1)
    _, hung_at = stop_rank(stopped_run, 1)
    seen = follow(lambda: status(tmp_path, stopped_run), hung_at, timeout_s=30 + 60)
    took, state, reason = seen.end
    stalled_at = seen.first(lambda s, r: s == "running" and r.startswith("stalled (no progress for"))
    assert stalled_at is not None and stalled_at < 30, seen.states
    assert f" on {HOST})" in next(r for _, s, r in seen.states if r.startswith("stalled")), seen.states
    assert state == "failed" and reason.startswith(f"hung: rank 1 on {HOST} made no progress for "), reason
    assert "rank 1 stopped (state T)" in reason and "(last: epoch " in reason, reason
    assert took <= 30 + 60, took
    batch = (stopped_run / "logs" / "batch.log").read_text()
    assert "rank 0 on" in batch and "its Python stacks" in batch and "cannot dump its stacks" in batch
    assert 'in all_reduce' in (stopped_run / "logs" / "rank-0.log").read_text() or "Current thread" in (
        stopped_run / "logs" / "rank-0.log").read_text()
    assert gone(pids) == [], "a rank was left behind"
    record_measurement("hang_local_sigstop", {"hang_timeout_s": 30, "hang_to_end_s": round(took, 1),
                                              "stalled_after_s": round(stalled_at, 1)})

    blocked = follow(lambda: status(tmp_path, blocked_run), time.monotonic(), timeout_s=120)
    _, state, reason = blocked.end
    assert state == "failed" and reason.startswith(f"hung: rank 1 on {HOST} made no progress for "), reason
    rank1 = (blocked_run / "logs" / "rank-1.log").read_text()
    assert "blocking_loss.py" in rank1 and "in blocking_loss" in rank1, rank1[-2000:]  # its own stack
    assert "its Python stacks" in (blocked_run / "logs" / "batch.log").read_text()
    blocked_pids = [b.pid for b in wait_for_beats(blocked_run, 2, timeout_s=5).values()]
    assert gone(blocked_pids) == []

    # hang_action: requeue: launched again from its last checkpoint (as --resume does), and it completes.
    again = follow(lambda: status(tmp_path, requeued_run), time.monotonic(), timeout_s=150)
    assert again.end[1] == "completed", again.states[-3:]
    row = status(tmp_path, requeued_run)
    assert row["restarts"] == 1, row
    events = [json.loads(line) for line in (requeued_run / "state.jsonl").read_text().splitlines()]
    requeued = [e for e in events if e["event"] == "requeued" and e.get("writer") == "watchdog"]
    assert len(requeued) == 1 and requeued[0]["reason"].startswith(f"hung: rank 1 on {HOST} made no progress for ")
    evaluated = [json.loads(line) for line in (requeued_run / "metrics.jsonl").read_text().splitlines()
                 if '"record": ' not in line]
    assert sorted({m["epoch"] for m in evaluated}) == list(range(1, 13))
    assert "launching it again from its last checkpoint" in (requeued_run / "logs" / "batch.log").read_text()


def test_a_throttled_rank_is_named_as_a_straggler_by_status_and_report(tmp_path):
    run_dir = submit(tmp_path, "slow", "--tasks-per-node", "3", "--set", "train.epochs=400", "--set",
                     "train.batch_size=60", "--set", "train.sync_bn=false", "--set", "slurm.hang_timeout_s=60")
    beats = wait_for_beats(run_dir, 3)
    pid = beats[2].pid
    done = threading.Event()

    def throttle() -> None:  # mostly stopped: most of rank 2's steps are interrupted while it computes
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.03)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.006)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        deadline, row, line = time.monotonic() + 90, {}, ""
        while time.monotonic() < deadline:  # both views while it is throttled (an idle rank 0 can read 1.3x on 2 cores)
            row = status(tmp_path, run_dir)
            line = cli("status", str(run_dir), cwd=tmp_path, env=_env(tmp_path)).stdout
            if row.get("straggler", {}).get("rank") == 2 and f"straggler rank 2 on {HOST} (" in line:
                break
            time.sleep(1)
    finally:
        done.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)
    assert row.get("straggler", {}).get("rank") == 2 and row["straggler"]["host"] == HOST, row
    assert row["straggler"]["ratio"] > 1.3
    assert f"straggler rank 2 on {HOST} (" in line, line
    report = cli("report", str(run_dir), cwd=tmp_path, env=_env(tmp_path))
    assert report.returncode == 0 and f"rank 2 on {HOST} (in " in report.stdout, report.stdout
    assert "GPU-hours" in report.stdout
    records = [ln for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if '"stragglers": [{"rank": 2' in ln]
    record_measurement("straggler_local", {"status_line": line, "report": report.stdout.splitlines()[:4],
                                           "record": records[-1] if records else None})
    cancelled = cli("cancel", str(run_dir), cwd=tmp_path, env=_env(tmp_path))
    assert cancelled.returncode == 0
    deadline = time.monotonic() + 20  # the launcher ends the ranks (SIGTERM, then SIGKILL after 5 s)
    while gone([b.pid for b in beats.values()]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert gone([b.pid for b in beats.values()]) == []
