"""Your own command and the research loop on the harness cluster (2 nodes x 4 fake GPUs, CPUs, gloo):
`submit -- CMD` on 2 nodes x 2 tasks (the mapping and the argv every rank gets, a failing rank named with its
host), a command that checkpoints on the signal being requeued and resuming, two runs of a client that keeps its
snapshot in its working directory (each in its own <run dir>/work), `report` over a 2 x 2 sweep
(loss x seed) of the digits job checked against metrics.jsonl, and the same sweep with `--pack 2` giving the
same per-run metrics. The local counterparts: tests/unit/local/test_commands_local.py."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest

from tests.cli_helpers import launch_span
from tests.cluster import harness
from tests.real_cluster.test_lifecycle import _restart_count, hpc, metrics, submit_json, wait_for, wait_state

pytestmark = pytest.mark.timeout(600)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
HOSTILE = ["$(touch pwned)", "010", "a b", "it's"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("slurm-commands")


@pytest.mark.lifecycle
def test_command_on_two_nodes_sees_the_mapping_and_a_failing_rank_is_named(slurm_cluster, work):
    result = hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "2", "--wait", "--", slurm_cluster.job_python,
                 str(SCRIPTS / "show_rank.py"), "3", *HOSTILE, cwd=work, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    run_dir = Path(next((work / "runs" / "show_rank").glob("[0-9]*")))
    seen = [json.loads((run_dir / f"seen-{rank}.json").read_text()) for rank in range(4)]
    assert [s["argv"] for s in seen] == [["3", *HOSTILE]] * 4 and not (work / "pwned").exists()
    env = [s["env"] for s in seen]
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["WORLD_SIZE"], e["SLURMD_NODENAME"]) for e in env] == [
        ("0", "0", "0", "4", "gpu01"), ("1", "1", "0", "4", "gpu01"), ("2", "0", "1", "4", "gpu02"),
        ("3", "1", "1", "4", "gpu02")]
    assert {e["MASTER_ADDR"] for e in env} == {"gpu01"} and len({e["MASTER_PORT"] for e in env}) == 1
    status = json.loads(hpc(slurm_cluster, "status", "show_rank", "--json", cwd=work).stdout)
    assert status["state"] == "failed" and status["first_failure"].startswith("rank 3 on gpu02: Exited with exit code 7")
    assert "rank 3 on gpu02" in result.stderr


@pytest.mark.lifecycle
def test_a_command_that_checkpoints_on_the_signal_is_requeued_and_resumes(slurm_cluster, work):
    # 150 steps of 0.1 s before the signal; the requeued attempt steps at 0.01 s: it has only to finish (13 s saved)
    out = json.loads(hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "2", "--json", "--", slurm_cluster.job_python,
                         str(SCRIPTS / "checkpoint_on_signal.py"), "150", "0.01",
                         cwd=work).stdout.splitlines()[-1])
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    wait_for(lambda: len(list(run_dir.glob("started-*-0"))) == 4, 60, "all four ranks started")
    time.sleep(2)
    harness.run_slurm(["scancel", "--signal=USR2", job_id], env=slurm_cluster.env)
    assert wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=180) == "COMPLETED"
    assert _restart_count(job_id, slurm_cluster.env) == 1
    done = [json.loads((run_dir / f"done-{rank}.json").read_text()) for rank in range(4)]
    assert all(d["step"] == 150 and d["restart"] == 1 and 0 < d["resumed_from"] < 150 for d in done), done
    status = json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=work).stdout)
    assert status["state"] == "completed" and status["restarts"] == 1
    assert "requeued job" in (run_dir / "logs" / "batch.log").read_text()


def test_two_runs_of_a_client_that_keeps_its_snapshot_in_its_cwd_never_see_each_other(slurm_cluster, tmp_path):
    # The DDP tutorial's snapshot.pt, on 2 nodes: the second run found the first's (it ran in the submit directory).
    shutil.copy(SCRIPTS / "snapshot_in_cwd.py", tmp_path / "client.py")
    runs = []
    for _ in range(2):  # with --wait the JSON line comes first, the run's end after it
        out = hpc(slurm_cluster, "submit", "--nodes", "2", "--tasks-per-node", "1", "--gpus", "1", "--json", "--wait",
                  "--", "python", "client.py", "once", cwd=tmp_path).stdout
        runs.append(json.loads(next(line for line in out.splitlines() if line.startswith("{"))))
    for run in runs:
        run_dir = Path(run["run_dir"])
        seen = [json.loads(line) for line in (run_dir / "seen.jsonl").read_text().splitlines()]
        assert sorted((s["rank"], s["cwd"], s["found"]) for s in seen) == \
            [(0, str(run_dir / "work"), None), (1, str(run_dir / "work"), None)], seen
        assert {s["submit_dir"] for s in seen} == {str(tmp_path)}
        assert (run_dir / "work" / "snapshot-1.pt").read_text() == run_dir.name  # written on the second node
    assert not list(tmp_path.glob("snapshot-*"))


def _stats(values):
    return statistics.fmean(values), statistics.stdev(values)


def test_report_over_a_loss_by_seed_sweep_and_pack_2_gives_the_same_runs(slurm_cluster, work):
    sweep = ["digits_lt_demo", "--gpus", "1", "--set", "train.device=cpu", "--set", "train.epochs=2",
             "--set", "train.schedule.warmup_epochs=0", "--set", "train.batch_size=32", "--set", "train.num_threads=1",
             "--sweep", "train.loss.name=ce,balanced_softmax", "--sweep", "train.seed=0,1"]
    alone = submit_json(slurm_cluster, *sweep, "--name", "lt-sweep", "--wait", cwd=work)
    packed = submit_json(slurm_cluster, *sweep, "--name", "lt-packed", "--pack", "2", "--wait", cwd=work)
    assert len(alone["tasks"]) == len(packed["tasks"]) == 4 and "2 point(s) per task" in packed["note"]

    # --pack 2: each point its own run, the same metrics as alone; two points per array task, together.
    for one, together in zip(alone["tasks"], packed["tasks"]):
        drop = lambda records: [{k: v for k, v in r.items() if k != "time"} for r in records]  # noqa: E731
        assert drop(metrics(work / "runs" / "lt-sweep" / one)) == drop(metrics(work / "runs" / "lt-packed" / together))
    records = [json.loads((work / "runs" / "lt-packed" / t / "run.json").read_text()) for t in packed["tasks"]]
    assert [r["job_id"].split("_")[1] for r in records] == ["0", "0", "1", "1"]
    ports = {json.loads((work / "runs" / "lt-packed" / t / "ranks" / "rank-0.json").read_text())["master_port"]
             for t in packed["tasks"]}
    assert len(ports) == 4
    for first, second in ((0, 1), (2, 3)):  # the two points of a task ran at the same time
        spans = [launch_span(work / "runs" / "lt-packed" / packed["tasks"][i]) for i in (first, second)]
        assert spans[0][0] <= spans[1][1] and spans[1][0] <= spans[0][1], spans

    report = json.loads(hpc(slurm_cluster, "report", "lt-sweep", "--json", cwd=work).stdout)
    assert report["config_keys"] == ["train.loss.name"] and report["seed_keys"] == ["train.seed"]
    rows = {row["config"]["train.loss.name"]: row for row in report["configurations"]}
    assert sorted(rows) == ["balanced_softmax", "ce"]
    for loss, row in rows.items():
        assert row["counts"] == {"finished": 2, "running": 0, "failed": 0}
        run_dirs = [work / "runs" / "lt-sweep" / t for t in alone["tasks"]
                    if json.loads((work / "runs" / "lt-sweep" / t / "config.json").read_text())["train"]["loss"]["name"] == loss]
        evals = [metrics(d) for d in run_dirs]
        for metric in ("top1", "balanced", "many", "medium", "few"):
            best = [max(e, key=lambda r: r["top1"])[metric] for e in evals]  # first of equals, as max() is
            last = [e[-1][metric] for e in evals]
            for which, values in (("best_on_test", best), ("last", last)):  # no held-out split: no "best"
                mean, std = _stats(values)
                got = row[which][metric]
                assert got["n"] == 2 and got["mean"] == pytest.approx(mean, abs=1e-12)
                assert got["std"] == pytest.approx(std, abs=1e-12)
    text = hpc(slurm_cluster, "report", "lt-sweep", cwd=work).stdout
    assert "sample std (ddof 1) over train.seed" in text and "train.loss.name=balanced_softmax" in text
