"""What status and report show (issue 19, items 11 and 12, and the status promises of the README): plain
`status` without Slurm lists every run (Slurm runs that have not ended as unknown, "no Slurm here"); a sweep is
one line with its points per state, NAME/ID_K one point; `--wait` names every point that did not complete;
`report` lists configurations in sweep order with their seeds sorted; accuracy is percent in human output and
fractions in --json, whose fields are the README's."""

import json
import re
from pathlib import Path

import pytest

from hpc_train.errors import JobFailedError
from hpc_train.runs import report, rundir
from hpc_train.runs.index import load_run
from hpc_train.runs.submission import SubmitResult
from hpc_train.front.follow import wait_for
from tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parents[3]
FIGURES = {"epoch": 10, "global_step": 70, "top1": 0.812, "balanced": 0.8, "many": 1.0, "medium": 0.996, "few": 0.535}


def make_run(group: Path, run_id: str, *events, cluster="local", config=None, metrics=None) -> Path:
    run_dir = group / run_id
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": run_id, "cluster": cluster, "logs": rundir.own_logs(run_dir),
                                                  "submitted_at": "2026-01-01T00:00:00+00:00"}))
    (run_dir / "job.yaml").write_text("name: x\n")
    (run_dir / "config.json").write_text(json.dumps(config or {"name": group.name}))
    (run_dir / "state.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [{"event": "queued"}, *events]))
    for record in metrics or []:
        with open(run_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps({"phase": "main", **record}) + "\n")
    return run_dir


def ended(code, reason=None):
    running = {"event": "running", "instance": "local:a.0"}
    failed = [{"event": "failed", "instance": "local:a.0", "reason": reason, "exit_code": code}] if reason else []
    return [running, *failed, {"event": "exit", "instance": "local:a.0", "exit_code": code}]


@pytest.fixture
def sweep(tmp_path):
    group = tmp_path / "runs" / "lt-sweep"
    make_run(group, "local-1_0", *ended(0), metrics=[FIGURES])
    make_run(group, "local-1_1", *ended(0))
    make_run(group, "local-1_2", *ended(2, "bad data"))
    make_run(group, "local-1_3", {"event": "running", "instance": "local:a.0"}, {"event": "cancelled", "reason": "by you"})
    return group


def test_a_sweep_is_one_line_of_its_points_per_state_and_a_point_is_one(tmp_path, sweep):
    line = cli("status", "lt-sweep", cwd=tmp_path).stdout.strip()
    assert line == ("lt-sweep/local-1_*  job local-1  4 point(s): 2 completed, 1 failed, 1 cancelled; "
                    "completed: local-1_0, local-1_1; "
                    "did not complete: local-1_2 failed, local-1_3 cancelled")
    for ref in ("lt-sweep/local-1_*", "local-1", "lt-sweep/local-1"):
        assert cli("status", ref, cwd=tmp_path).stdout.strip() == line, ref
    from hpc_train.runs.sweeps import SWEEP_FIELDS

    data = json.loads(cli("status", "lt-sweep", "--json", cwd=tmp_path).stdout)
    assert tuple(data) == SWEEP_FIELDS and data["points"] == 4 and [r["run"] for r in data["runs"]] == [
        f"lt-sweep/local-1_{k}" for k in range(4)]
    assert data["counts"] == {"completed": 2, "failed": 1, "cancelled": 1}
    point = cli("status", "lt-sweep/local-1_0", cwd=tmp_path).stdout.strip()
    # One point, its accuracy in percent (the logs' unit); --json keeps fractions.
    assert point.startswith("lt-sweep/local-1_0  job local-1_0  completed  (") and "top1=81.2%" in point
    assert json.loads(cli("status", "lt-sweep/local-1_0", "--json", cwd=tmp_path).stdout)["progress"]["top1"] == 0.812


def test_wait_names_every_point_that_did_not_complete(sweep):
    dirs = tuple(str(sweep / f"local-1_{k}") for k in range(4))
    result = SubmitResult(job_id="local-1_0", run_name="lt-sweep/local-1_*", run_dir=dirs[0], cluster="local",
                          run_dirs=dirs)
    with pytest.raises(JobFailedError) as failed:
        wait_for(result, poll_s=0.01)
    first = str(failed.value).splitlines()[0]
    assert first == ("lt-sweep/local-1_*: 2 of 4 point(s) did not complete: lt-sweep/local-1_2 failed (bad data); "
                     "lt-sweep/local-1_3 cancelled (by you)")
    assert failed.value.exit_code == 1  # one was cancelled: not every one refused its input


def test_plain_status_without_slurm_lists_every_run(tmp_path, stub_slurm):
    # Item 11: it failed as a whole ("'squeue' is not on PATH", exit 2) once a Slurm run was in the registry.
    for tool in stub_slurm.TOOLS:
        stub_slurm.remove(tool)
    group = tmp_path / "runs" / "demo"
    make_run(group, "4242", {"event": "running", "instance": "slurm:4242.0"}, cluster="slurm")
    make_run(group, "4243", {"event": "running", "instance": "slurm:4243.0"}, {"event": "exit", "exit_code": 0,
                                                                              "instance": "slurm:4243.0"}, cluster="slurm")
    make_run(group, "local-9", *ended(0))
    result = cli("status", cwd=tmp_path, env=stub_slurm.env())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("demo/4242  job 4242  unknown  (reason no Slurm here (last recorded: running)")
    assert lines[1].startswith("demo/4243  job 4243  completed") and lines[2].startswith("demo/local-9  job local-9  completed")
    from hpc_train.runs.status import STATUS_FIELDS

    one = json.loads(cli("status", "demo/4242", "--json", cwd=tmp_path, env=stub_slurm.env()).stdout)
    assert (one["state"], one["slurm_reason"]) == ("unknown", "no Slurm here")
    assert [k for k in STATUS_FIELDS if k in one] == list(one)  # the documented fields, in their order


def _unreachable_slurm_conf(tmp_path):
    """A slurm.conf whose controller nobody listens for, asked with short timeouts."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/none\n"
                    "MessageTimeout=1\nTCPTimeout=1\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return conf


def test_a_test_only_that_never_reached_slurm_says_so(tmp_path, monkeypatch):
    # Review of issue 19, N10: "Slurm would refuse this job: ... Unable to contact slurm controller": Slurm
    # did not refuse it, it was not reached. The real sbatch, its controller out of reach.
    import shutil

    from hpc_train.errors import SubmitError
    from hpc_train.slurm import client

    assert shutil.which("sbatch"), "Slurm's client tools are a prerequisite of this suite (see tests/cluster)"
    monkeypatch.setenv("SLURM_CONF", str(_unreachable_slurm_conf(tmp_path)))
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n#SBATCH -n 1\nsrun true\n")
    with pytest.raises(SubmitError, match=r"^Slurm was not reached, so it did not judge this job \(sbatch "
                                          r"--test-only: .*Unable to contact slurm controller"):
        client.test_only(str(tmp_path / "job.sbatch"))


def test_plain_status_with_a_squeue_that_fails_lists_every_run(tmp_path):
    # Review of issue 19, S1: the real squeue, its controller out of reach ("Unable to contact slurm
    # controller"), failed the whole listing (exit 2) and hid the local runs.
    import os
    import shutil

    assert shutil.which("squeue"), "Slurm's client tools are a prerequisite of this suite (see tests/cluster)"
    conf = _unreachable_slurm_conf(tmp_path)
    group = tmp_path / "runs" / "demo"
    make_run(group, "4242", {"event": "running", "instance": "slurm:4242.0"}, cluster="slurm")
    make_run(group, "local-9", *ended(0))
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(conf), "HOME": str(tmp_path),
           "HPC_TRAIN_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    result = cli("status", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("demo/4242  job 4242  unknown  (reason squeue failed: "), lines[0]
    assert "(last recorded: running)" in lines[0] and lines[1].startswith("demo/local-9  job local-9  completed")


def test_report_lists_configurations_in_sweep_order_and_seeds_sorted(tmp_path):
    # A 4 x 3 loss x seed sweep: points 0-11, loss-major. Sorted by name as text (60_10 before 60_2) it came
    # out ce, logit_adjusted, focal, balanced_softmax, with seeds "1, 2, 0".
    losses = ["ce", "focal", "logit_adjusted", "balanced_softmax"]
    group = tmp_path / "runs" / "lt"
    for point in range(12):
        loss, seed = losses[point // 3], point % 3
        make_run(group, f"60_{point}", *ended(0), config={"name": "lt", "train": {"loss": {"name": loss}, "seed": seed}},
                 metrics=[{**FIGURES, "top1": 0.5 + point / 100}])
    runs = sorted((load_run(d) for d in group.iterdir()), key=lambda r: -int(r.run_dir.name.split("_")[1]))
    data = report.summarise([report.load(r, "completed") for r in runs])
    assert [row["config"]["train.loss.name"] for row in data["configurations"]] == losses
    assert all([s["train.seed"] for s in row["seeds"]] == [0, 1, 2] for row in data["configurations"])
    text = report.format_report(data)
    assert re.findall(r"train\.loss\.name=(\w+)", text) == losses and text.count("seeds 0, 1, 2;") == 4
    assert data["rows"] == ["last", "best", "best_on_test"]
    assert data["columns"] == ["top1", "balanced", "many", "medium", "few", "ece"]


def test_the_readme_lists_the_status_fields_the_code_gives():
    from hpc_train.runs.status import STATUS_FIELDS
    from hpc_train.runs.sweeps import SWEEP_FIELDS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    one = re.search(r"`status RUN --json` gives, in fractions, the fields (.*?)\(a field", readme, re.S).group(1)
    assert tuple(re.findall(r"`(\w+)`", one)) == STATUS_FIELDS
    many = re.search(r"its `--json` has (.*?)\(each point", readme, re.S).group(1)
    assert tuple(re.findall(r"`(\w+)`", many)) == SWEEP_FIELDS
