"""``status`` of every point of a sweep whose array ended and of one cancelled while pending (issue 26): sacct
lists an ended array for a while under its bare array id, and a pending-cancelled array as one range record
(``15_[0-2%2]``, node list ``None assigned``); neither may read as ``slurm state UNKNOWN``, nor the placeholder as a
node list. Canned forms: tests/unit/slurm/test_slurm_outputs.py."""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster import harness
from tests.real_cluster.test_hangs import _extra
from tests.real_cluster.test_lifecycle import hpc

pytestmark = pytest.mark.timeout(170)

FAILING = ["digits_lt_demo", "--tasks-per-node", "1", "--set", "train.device=cpu",
           "--set", "train.loss.name=tests.scripts.failing_loss:build"]  # each point fails within seconds of its start


def _points(cluster, work, name: str, sweep_id: str, count: int) -> list[dict]:
    return [json.loads(hpc(cluster, "status", f"{name}/{sweep_id}_{i}", "--json", cwd=work, env_extra=_extra()).stdout)
            for i in range(count)]


def _gone(cluster, array: str) -> bool:
    out = harness.run_slurm(["squeue", "-h", "-j", array, "-o", "%i"], env=cluster.env, check=False)
    return out.returncode != 0 or not out.stdout.strip()


def test_points_of_an_ended_and_a_pending_cancelled_array_have_slurm_states(slurm_cluster, tmp_path):
    cluster, work = slurm_cluster, tmp_path
    pending = json.loads(hpc(cluster, "submit", *FAILING, "--name", "later", "--json", "--sweep", "train.seed=0,1,2",
                             "--max-parallel", "2", "--set", "slurm.extra_sbatch={begin: now+3600}", cwd=work,
                             env_extra=_extra()).stdout.splitlines()[-1])
    ended = json.loads(hpc(cluster, "submit", *FAILING, "--name", "ended", "--json", "--sweep", "train.seed=0,1",
                           cwd=work, env_extra=_extra()).stdout.splitlines()[-1])
    hpc(cluster, "cancel", "later", cwd=work, env_extra=_extra())
    deadline = time.monotonic() + 120
    while not (_gone(cluster, ended["job_id"]) and _gone(cluster, pending["job_id"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = {"at once": _points(cluster, work, "ended", ended["job_id"], 2)
            + _points(cluster, work, "later", pending["job_id"], 3)}
    time.sleep(6)  # accounting has settled its records
    seen["settled"] = _points(cluster, work, "ended", ended["job_id"], 2) + _points(cluster, work, "later",
                                                                                     pending["job_id"], 3)
    for when, rows in seen.items():
        states = [(r["run"], r["state"], r.get("slurm_state"), r.get("reason", "")) for r in rows]
        assert all(r.get("slurm_state") not in (None, "UNKNOWN") for r in rows), (when, states)
        assert [r["state"] for r in rows] == ["failed"] * 2 + ["cancelled"] * 3, (when, states)
        assert not any("None assigned" in json.dumps(r) for r in rows), (when, rows)
