"""The rank that failed first is the one named (issue 28, item 7). Real gloo ranks of the shared trainer: rank 1
is SIGKILLed mid-training (what the out-of-memory killer does); rank 0 then loses its peer in the gradient
all-reduce ("Connection closed by peer") and records that failure itself, but it is a consequence: the run's
reason names rank 1 and its signal. The state log's fold is checked on the lines themselves too."""

import json
import os
import signal
import socket
from pathlib import Path

from hpc_train.runs import rundir
from tests.cli_helpers import cli
from tests.unit.local.supervision import alive, wait_until

QUICK = ["--set", "train.schedule.warmup_epochs=0", "--set", "train.epochs=200", "--set", "train.eval_every_epochs=1"]
SIGKILLED = "ended by SIGKILL (signal 9, as the out-of-memory killer does)"


def test_a_sigkilled_gloo_rank_is_named_not_the_peer_that_lost_it(tmp_path):
    result = cli("submit", "--cluster", "local", "--tasks-per-node", "2", "--json", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run_dir = Path(out["run_dir"])
    # In training: the first epoch was evaluated, so both ranks are in the loop's all-reduces.
    wait_until(lambda: (run_dir / "metrics.jsonl").exists() and '"epoch"' in (run_dir / "metrics.jsonl").read_text(),
               180, "the first epoch evaluated")
    victim = json.loads((run_dir / "ranks" / "rank-1.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)
    # Until the launch's end (its exit line): rank 0's own failure line, written first, already reads as final.
    wait_until(lambda: any(e["event"] == "exit" for e in rundir.read_events(run_dir)), 60, "the launch ended")
    found = json.loads(cli("status", out["run_name"], "--json", cwd=tmp_path).stdout)
    host = socket.gethostname()
    assert found["state"] == "failed" and found["reason"] == f"rank 1 on {host}: {SIGKILLED}", found
    batch = (run_dir / "logs" / "batch.log").read_text()
    assert f"error: {host}: task 1: {SIGKILLED}" in batch and "task 0:" not in batch, batch
    assert not alive(victim)


CONSEQUENCE = {"event": "failed", "instance": "local:r.0", "rank": 0, "exit_code": 1,
               "reason": "rank 0 on h: RuntimeError: Connection closed by peer"}
RUNNING = {"event": "running", "instance": "local:r.0", "writer": "launcher"}


CASES = [  # (state lines, the reason and exit code they fold into)
    # rank 1 was killed (it wrote nothing); rank 0's consequence came first: the launcher's line names rank 1
    ([RUNNING, CONSEQUENCE, {"event": "failed", "instance": "local:r.0", "writer": "launcher", "first_rank": 1,
                             "exit_code": 137, "reason": f"rank 1 on h: {SIGKILLED}"},
      {"event": "exit", "instance": "local:r.0", "exit_code": 137}], f"rank 1 on h: {SIGKILLED}", 137),
    # rank 1 failed with its own words first: the launcher's naming keeps them, not its exit code's
    ([RUNNING, {"event": "failed", "instance": "local:r.0", "rank": 1, "exit_code": 2, "reason": "bad data"},
      CONSEQUENCE, {"event": "failed", "instance": "local:r.0", "writer": "launcher", "first_rank": 1, "exit_code": 2,
                    "reason": "rank 1 on h: Exited with exit code 2"}], "bad data", 2),
    # a failure of an earlier launch is not this launch's rank's words
    ([{**RUNNING, "instance": "local:r.0"}, {**CONSEQUENCE, "rank": 1, "reason": "old"}, {**RUNNING, "instance": "local:r.1"},
      {"event": "failed", "instance": "local:r.1", "writer": "launcher", "first_rank": 1, "exit_code": 137,
       "reason": f"rank 1 on h: {SIGKILLED}"}], f"rank 1 on h: {SIGKILLED}", 137),
]


def test_the_launchers_first_failure_decides_the_reason():
    folded = [(s.state, s.reason, s.exit_code) for s in (rundir.fold(events) for events, _, _ in CASES)]
    assert folded == [("failed", reason, code) for _, reason, code in CASES]
