"""The batch script's watchdog on the harness (2 nodes, one gloo rank each; issue 18): a rank stopped with SIGSTOP
and a rank that blocks forever in a plug-in loss. ``status`` says ``stalled`` before the timeout; then the run is
``failed`` naming the rank and its node, the other rank's stacks (and the blocked rank's own) are in the logs, and
no process is left on any node. The local counterparts: tests/unit/local/test_hangs_local.py.

The test stops the rank with ``os.kill`` from here: the harness's nodes share this machine's process table (the
watchdog itself reads states through a diagnostic ``srun --overlap`` on each node, as on a real cluster)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.hang_helpers import follow, gone, record_measurement, stop_rank, wait_for_beats
from tests.real_cluster.test_lifecycle import hpc

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
TWO_NODES = ["--nodes", "2", "--tasks-per-node", "1", "--set", "train.device=cpu", "--set", "train.epochs=2000"]
BLOCKING_LOSS = ["--set", "train.loss.name=tests.scripts.blocking_loss:build",
                 "--set", "train.loss.args={block_at_call: 30, block_rank: 1}"]


def _extra() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def submit(cluster, work: Path, name: str, *args: str) -> tuple[str, Path]:
    out = hpc(cluster, "submit", "digits_lt_demo", "--name", name, "--json", *TWO_NODES, *args, cwd=work,
              env_extra=_extra())
    data = json.loads(out.stdout.splitlines()[-1])
    return data["job_id"], Path(data["run_dir"])


def rank_log(run_dir: Path, rank: int) -> str:
    """A rank's stderr, where submitit's form writes it (the run record says where)."""
    logs = json.loads((run_dir / "run.json").read_text())["logs"]
    return Path(logs.get("rank_err", logs["rank_out"]).format(rank=rank)).read_text(errors="replace")


def status(cluster, work: Path, job_id: str) -> dict:
    return json.loads(hpc(cluster, "status", job_id, "--json", cwd=work, env_extra=_extra()).stdout)


def test_a_stopped_rank_and_a_blocked_rank_end_their_jobs_naming_rank_and_node(slurm_cluster, tmp_path):
    work = tmp_path
    stopped_job, stopped_run = submit(slurm_cluster, work, "stopped", "--set", "slurm.hang_timeout_s=30")
    blocked_job, blocked_run = submit(slurm_cluster, work, "blocked", "--set", "slurm.hang_timeout_s=10",
                                      *BLOCKING_LOSS)
    beats = wait_for_beats(stopped_run, 2)
    assert {b.host for b in beats.values()} == {"gpu01", "gpu02"} and beats[1].host == "gpu02"
    time.sleep(1)
    _, hung_at = stop_rank(stopped_run, 1)
    seen = follow(lambda: status(slurm_cluster, work, stopped_job), hung_at, timeout_s=30 + 60)
    took, state, reason = seen.end
    stalled_at = seen.first(lambda s, r: s == "running" and r.startswith("stalled (no progress for"))
    assert stalled_at is not None and stalled_at < 30, seen.states
    assert state == "failed" and reason.startswith("hung: rank 1 on gpu02 made no progress for "), seen.states[-3:]
    assert "rank 1 stopped (state T)" in reason, reason
    assert took <= 30 + 60
    batch = (stopped_run / "logs" / "batch.log").read_text()
    assert "rank 0 on gpu01" in batch and "its Python stacks" in batch and "cannot dump its stacks" in batch, batch
    assert gone([b.pid for b in beats.values()]) == [], "a rank was left behind"
    final = status(slurm_cluster, work, stopped_job)
    assert final["exit_code"] == 124 and final.get("slurm_state") in ("FAILED", "COMPLETED", "RUNNING", "COMPLETING")
    record_measurement("hang_slurm_sigstop", {"hang_timeout_s": 30, "hang_to_end_s": round(took, 1),
                                              "stalled_after_s": round(stalled_at, 1), "reason": reason,
                                              "stalled": next(r for _, s, r in seen.states if r.startswith("stalled")),
                                              "batch_log": [ln for ln in batch.splitlines() if "watchdog" in ln][:12]})

    blocked = follow(lambda: status(slurm_cluster, work, blocked_job), time.monotonic(), timeout_s=150)
    _, state, reason = blocked.end
    assert state == "failed" and reason.startswith("hung: rank 1 on gpu02 made no progress for "), blocked.states[-3:]
    rank1 = rank_log(blocked_run, 1)
    record_measurement("hang_slurm_blocked", {"reason": reason})
    assert "blocking_loss.py" in rank1 and "in blocking_loss" in rank1, rank1[-3000:]  # its own stack
    assert gone([b.pid for b in wait_for_beats(blocked_run, 2, timeout_s=5).values()]) == []
