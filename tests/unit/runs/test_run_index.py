"""The run index (hpc_train.runs.index): runs of job files with their own runs_dir are found by name, and
the index drops the runs whose directory is gone once it has grown large, keeping every live one."""

import json
from pathlib import Path

from hpc_train.runs import index as run_index


def make_run(root: Path, name: str) -> Path:
    run_dir = root / "group" / name
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": name}))
    return run_dir


def indexed_dirs() -> list[str]:
    return [json.loads(line)["run_dir"] for line in run_index.index_path().read_text().splitlines()]


def test_a_run_elsewhere_is_found_by_name_and_id(tmp_path):
    run_dir = make_run(tmp_path / "elsewhere", "41")
    assert run_index.register([run_dir], tmp_path) is None
    assert run_index.resolve_run("group/41", tmp_path / "runs").run_dir == run_dir
    assert run_index.resolve_run("41", tmp_path / "runs").run_dir == run_dir


def test_a_large_index_drops_the_runs_that_are_gone_and_keeps_the_others(tmp_path):
    live = [make_run(tmp_path, f"live-{i}") for i in range(3)]
    gone = [tmp_path / "group" / f"gone-{i}" for i in range(40)]
    run_index.register(gone[:20] + live[:2] + gone[20:], tmp_path)
    size = run_index.index_path().stat().st_size
    # Below the threshold nothing is dropped...
    run_index.register([live[2]], tmp_path, prune_at_bytes=size * 2)
    assert len(indexed_dirs()) == 43
    # ...above it, the runs that are gone are, in one rewrite, and the new line is kept.
    newest = make_run(tmp_path, "newest")
    run_index.register([newest], tmp_path, prune_at_bytes=size)
    assert indexed_dirs() == [str(d) for d in (*live, newest)]
    assert not list(run_index.index_path().parent.glob(".runs.jsonl.*"))  # no temporary file left behind


BROKEN_RECORDS = {"number": b"5", "list": b"[]", "empty": b"{}", "torn": b'{"job_id": "4', "not-utf8": b"\xff\xfe"}


def test_a_run_json_that_is_not_a_record_is_unreadable_never_a_plain_sbatch(tmp_path):
    # Review of issue 19, M11 and S2: `5` crashed every status (AttributeError); [], {} and torn JSON became a
    # Slurm run whose job id is the directory name, which status asked squeue about and cancel would scancel.
    for name, content in BROKEN_RECORDS.items():
        run_dir = tmp_path / "group" / name
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_bytes(content)
        run = run_index.load_run(run_dir)
        assert run.unreadable.startswith("run.json unreadable") and run.cluster == "unknown" and not run.on_slurm
    plain = tmp_path / "group" / "4242"
    plain.mkdir()
    (plain / "job.yaml").write_text("name: x\n")  # a plain sbatch of a rendered script: no run.json
    assert run_index.load_run(plain).on_slurm and run_index.load_run(plain).job_id == "4242"


def test_status_lists_an_unreadable_run_beside_the_others_and_cancel_refuses_it(tmp_path):
    import os

    from tests.cli_helpers import assert_refused, cli

    for name, content in BROKEN_RECORDS.items():
        (tmp_path / "runs" / "group" / name).mkdir(parents=True)
        (tmp_path / "runs" / "group" / name / "run.json").write_bytes(content)
    make_run(tmp_path / "runs", "local-1")
    (tmp_path / "runs" / "group" / "local-1" / "run.json").write_text(json.dumps({"job_id": "local-1",
                                                                                "cluster": "local"}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HPC_TRAIN_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    listed = cli("status", "--json", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    statuses = {s["run"]: s for s in json.loads(listed.stdout)}
    assert set(statuses) == {f"group/{n}" for n in [*BROKEN_RECORDS, "local-1"]}
    for name in BROKEN_RECORDS:
        assert statuses[f"group/{name}"]["state"] == "unknown" and "slurm_state" not in statuses[f"group/{name}"]
        assert statuses[f"group/{name}"]["reason"].startswith("run.json unreadable")
    assert_refused(cli("cancel", "group/empty", cwd=tmp_path, env=env), "run.json unreadable (not a run record)")


def test_runs_are_listed_oldest_submission_first_and_a_sweeps_points_in_order(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("HPC_TRAIN_STATE_DIR", str(tmp_path / "state"))
    root = tmp_path / "runs"
    sweep = {name: make_run(root, name) for name in ("7_10", "7_2", "7_1", "7_0")}
    for run_dir in sweep.values():  # one submission: the same second
        (run_dir / "run.json").write_text(json.dumps({"job_id": run_dir.name, "submitted_at": "2026-12-01T10:00:00+00:00"}))
    later = make_run(root, "8")
    (later / "run.json").write_text(json.dumps({"job_id": "8", "submitted_at": "2026-12-01T11:00:00+00:00"}))
    # The ranks' writes move a directory's mtime: the points last written to must not move up or down the list.
    for seconds, run_dir in enumerate([later, sweep["7_1"], sweep["7_0"], sweep["7_10"], sweep["7_2"]]):
        os.utime(run_dir, (1_000_000 + seconds, 1_000_000 + seconds))
    listed = [run.run_dir.name for run in run_index.all_runs(root)]
    assert listed == ["7_0", "7_1", "7_2", "7_10", "8"]


def test_a_run_of_train_alone_is_never_asked_of_slurm_and_its_end_is_seen(tmp_path, on_stub_path):
    # Issue 28, item 8: `hpc-train train` runs showed `completed (slurm state UNKNOWN...)`; one killed by SIGPIPE
    # stayed `unknown`/`running` forever.
    import subprocess
    import sys

    from hpc_train.front.status import run_status
    from hpc_train.runs import rundir

    done = tmp_path / "runs" / "demo" / "local-20260101-000000"
    (done / "ranks").mkdir(parents=True)
    (done / "job.yaml").write_text("name: demo\n")
    rundir.append_event(done, rundir.RUNNING, instance="pid:1", restart=0)
    rundir.append_event(done, rundir.COMPLETED, instance="pid:1", restart=0)
    row = run_status(run_index.load_run(done))
    assert row["state"] == "completed" and "slurm_state" not in row and on_stub_path.calls("squeue") == []
    killed = tmp_path / "runs" / "demo" / "local-20260101-000001"
    (killed / "ranks").mkdir(parents=True)
    (killed / "job.yaml").write_text("name: demo\n")
    gone = subprocess.Popen([sys.executable, "-c", "import hpc_train.train"])  # a trainer's cmdline, then it ends
    gone.wait()
    (killed / "ranks" / "rank-0.json").write_text(json.dumps({"rank": 0, "pid": gone.pid}))
    rundir.append_event(killed, rundir.RUNNING, instance="pid:2", restart=0)
    row = run_status(run_index.load_run(killed))
    assert row["state"] == "failed" and f"its process (pid {gone.pid}) ended" in row["reason"]
