"""On the harness restarted with a third node and MaxArraySize 10 (``slurm_cluster_3``, session-scoped: these
tests run last and share one restart, tests/cluster/fixtures.py; issue 18): a 2-node run whose rank hangs with ``hang_action: requeue`` is requeued,
the hung rank's node excluded (the run's list, the job's ExcNodeList), and completes on the other two nodes with
every epoch; a 25-point sweep becomes three job arrays that ``status``, ``cancel`` and ``report`` take as one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_train.runs.bad_nodes import excluded_names
from tests.cluster import harness
from tests.hang_helpers import follow, record_measurement, stop_rank, wait_for_beats
from tests.real_cluster.test_hangs import _extra, status
from tests.real_cluster.test_lifecycle import hpc, metrics, wait_for

pytestmark = pytest.mark.timeout(420)


def test_a_hung_rank_is_requeued_without_its_node_and_completes_every_epoch(slurm_cluster_3, tmp_path):
    cluster, epochs = slurm_cluster_3, 30
    out = hpc(cluster, "submit", "digits_lt_demo", "--name", "requeue", "--json", "--nodes", "2", "--tasks-per-node",
              "1", "--set", "train.device=cpu", "--set", f"train.epochs={epochs}", "--set", "slurm.hang_timeout_s=10",
              "--set", "slurm.hang_action=requeue", cwd=tmp_path, env_extra=_extra())
    data = json.loads(out.stdout.splitlines()[-1])
    job, run_dir = data["job_id"], Path(data["run_dir"])
    beats = wait_for_beats(run_dir, 2)
    wait_for(lambda: len(metrics(run_dir)) >= 3, 120, "three evaluated (and checkpointed) epochs")
    bad = beats[1].host
    _, hung_at = stop_rank(run_dir, 1)
    seen = follow(lambda: status(cluster, tmp_path, job), hung_at, timeout_s=240)
    took, state, _ = seen.end
    assert state == "completed", seen.states[-5:]
    row = status(cluster, tmp_path, job)
    assert row["restarts"] == 1 and row["excluded_nodes"] == [bad], row
    assert excluded_names(run_dir) == [bad]
    shown = harness.run_slurm(["scontrol", "show", "job", job], env=cluster.env).stdout
    assert f"ExcNodeList={bad}" in shown, shown
    second = [e for e in map(json.loads, (run_dir / "state.jsonl").read_text().splitlines())
              if e.get("event") == "running" and e.get("writer") == "launcher" and e.get("restart") == 1]
    assert second and bad not in harness_nodes(second[-1]["nodes"]), second
    assert sorted({m["epoch"] for m in metrics(run_dir)}) == list(range(1, epochs + 1))
    batch = (run_dir / "logs" / "batch.log").read_text()
    assert f"excluded node {bad}" in batch and f"requeued job {job}, excluding {bad}" in batch, batch[-3000:]
    record_measurement("hang_requeue_3_nodes", {"hang_timeout_s": 10, "hang_to_completed_s": round(took, 1),
                                                "status_line": hpc(cluster, "status", job, cwd=tmp_path).stdout,
                                                "exc_node_list": [w for w in shown.split() if "NodeList" in w],
                                                "batch_log": [ln for ln in batch.splitlines() if "watchdog" in ln]})


def harness_nodes(nodelist: str) -> list[str]:
    from hpc_train.hostlist import expand

    return expand(nodelist)


def test_a_sweep_larger_than_max_array_size_is_several_arrays_and_one_sweep(slurm_cluster_3, tmp_path):
    cluster = slurm_cluster_3
    seeds = "[" + ",".join(str(i) for i in range(25)) + "]"
    out = hpc(cluster, "submit", "digits_lt_demo", "--name", "split", "--json", "--tasks-per-node", "1",
              "--set", "train.device=cpu", "--epochs", "1", "--sweep", f"train.seed={seeds}",
              "--max-parallel", "1", cwd=tmp_path)
    data = json.loads(out.stdout.splitlines()[-1])
    assert "3 job arrays" in data["note"] and "MaxArraySize 10" in data["note"], data
    sweep_id = data["job_id"]
    runs = sorted((tmp_path / "runs" / "split").glob(f"{sweep_id}_*"), key=lambda p: int(p.name.split("_")[1]))
    assert [p.name for p in runs] == [f"{sweep_id}_{i}" for i in range(25)]
    arrays = {json.loads((p / "run.json").read_text())["array_job_id"] for p in runs}
    assert len(arrays) == 3
    scripts = list((tmp_path / "runs" / "split" / ".sweeps").glob("*/array-*.sbatch"))
    assert len(scripts) == 3 and all(p.stat().st_size < 20_000 for p in scripts)

    def sweep() -> dict:
        return json.loads(hpc(cluster, "status", "split", "--json", cwd=tmp_path).stdout)

    wait_for(lambda: sweep()["counts"].get("completed", 0) >= 3, 180, "the first point of each array completed")
    line = hpc(cluster, "status", "split", cwd=tmp_path).stdout
    assert "25 point(s)" in line and "3 job arrays" in line, line
    cancelled = hpc(cluster, "cancel", "split", cwd=tmp_path).stdout
    assert "point(s) (job arrays" in cancelled, cancelled
    wait_for(lambda: all(harness.job_state(a, env=cluster.env) in (None, "CANCELLED", "COMPLETED") for a in arrays),
             60, "every array left the queue")
    final = sweep()
    assert final["points"] == 25 and sorted(final["array_job_ids"]) == sorted(arrays), final
    done = final["counts"].get("completed", 0)
    assert done >= 3 and done + final["counts"].get("cancelled", 0) == 25, final["counts"]
    report = hpc(cluster, "report", "split", cwd=tmp_path).stdout
    assert report.startswith("25 run(s) in 1 configuration(s)"), report
    assert f"25 run(s): {done} finished, 0 running, {25 - done} failed" in report, report
    record_measurement("sweep_split", {"note": data["note"], "status_line": line, "cancel": cancelled,
                                       "final_line": hpc(cluster, "status", "split", cwd=tmp_path).stdout,
                                       "report_head": report.splitlines()[:4]})
