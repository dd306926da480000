"""front/status.py: Slurm is asked once for all the Slurm runs (never for a local one), its view is folded with
each run directory, and cancel reaches the scheduler only for a run it holds. Slurm's tools are stand-ins printing
what the test sets (tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_train.front import status
from hpc_train.runs import rundir
from hpc_train.runs.index import load_run


def make_run(group: Path, run_id: str, cluster: str, *events: dict) -> Path:
    run_dir = group / run_id
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": run_id, "cluster": cluster, "logs": rundir.own_logs(run_dir)}))
    lines = [{"event": "queued"}, *events]
    (run_dir / "state.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return run_dir


RUNNING = {"event": "running", "instance": "slurm:41.0"}


def test_slurm_is_asked_once_for_every_slurm_run_and_never_for_a_local_one(tmp_path, on_stub_path):
    on_stub_path.answer("squeue", "41|RUNNING|None|1:00|gpu01\n")
    on_stub_path.answer("sacct", "42|TIMEOUT|0:15|2:00:00|gpu02|None\n")
    runs = [load_run(make_run(tmp_path, "41", "slurm", RUNNING)), load_run(make_run(tmp_path, "42", "slurm", RUNNING)),
            load_run(make_run(tmp_path, "local-1", "local", {"event": "exit", "exit_code": 0}))]
    rows = status.run_statuses(runs)
    assert [(r["state"], r.get("slurm_state"), r.get("source")) for r in rows] == [
        ("running", "RUNNING", "squeue"), ("failed", "TIMEOUT", "sacct"), ("completed", None, None)]
    assert rows[1]["reason"] == "time limit reached (Slurm: TIMEOUT 0:15)"
    assert len(on_stub_path.calls("squeue")) == 1 and "-j 41,42 " in on_stub_path.calls("squeue")[0]
    assert len(on_stub_path.calls("sacct")) == 1 and "-j 42 " in on_stub_path.calls("sacct")[0]
    assert status.run_states(runs) == ["running", "failed", "completed"]


def test_cancel_scancels_only_what_slurm_holds_and_records_it(tmp_path, on_stub_path):
    on_stub_path.answer("squeue", "41|RUNNING|None|1:00|gpu01\n")
    slurm_run = load_run(make_run(tmp_path, "41", "slurm", RUNNING))
    assert status.cancel_run(slurm_run) == f"cancelled {slurm_run.name} (job 41)"
    assert on_stub_path.calls("scancel") == ["41"]
    assert rundir.read_state(slurm_run.run_dir).state == rundir.CANCELLED

    local_run = load_run(make_run(tmp_path, "local-2", "local", {"event": "running", "instance": "local:a.0"}))
    assert status.cancel_run(local_run).endswith("(local run)")
    assert on_stub_path.calls("scancel") == ["41"]  # nothing more asked of Slurm
    assert rundir.read_state(local_run.run_dir).state == rundir.CANCELLED  # the local runner ends the ranks on it
    assert status.cancel_run(local_run).endswith("has already ended (cancelled); nothing to cancel")
