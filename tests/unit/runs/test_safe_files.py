"""A run directory is safe to share (issue 28, item 4), with real symlinks, FIFOs and device files: nothing is
written through a symlink planted in a run directory or as the run index, nothing blocks on a FIFO or reads
/dev/zero without end, a log path a run.json names outside its job's directory is never printed, and a run.json,
state line or metrics line with wrong types makes that run `unknown` with the reason while the others are listed.
The commands that could hang run in a child with a deadline (a hang is a failure, not a stuck suite)."""

import json
import os
import time

import pytest

from hpc_train.runs import index as run_index
from hpc_train.runs import rundir, safe_files
from tests.cli_helpers import cli
from tests.unit.hostile.helpers import assert_clean_refusal, invoke, make_run, snapshot

DEADLINE_S = 20


@pytest.fixture
def victim(tmp_path):
    """A file of someone else's that a planted symlink points at."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


@pytest.fixture
def runs(tmp_path, on_stub_path):
    """A healthy local run and a Slurm run whose squeue says it is running, under ./runs."""
    root = tmp_path / "runs"
    good = make_run(root, "good", "local-1", cluster="local")
    bad = make_run(root, "bad", "4242")
    on_stub_path.answer("squeue", "4242|RUNNING|None|gpu01|0:10\n")
    return tmp_path, good, bad


def _status_all(cwd, stub):
    """Plain `hpc-train status` in a child with a deadline: a FIFO must never block everyone's listing."""
    started = time.monotonic()
    result = cli("status", "--json", cwd=cwd, env=stub.env(), timeout=DEADLINE_S)
    return result, time.monotonic() - started


def _row(result, run):
    assert result.returncode == 0, result.stderr
    return next(r for r in json.loads(result.stdout) if r["run"] == run)


@pytest.mark.parametrize("name", ["state.jsonl", "run.json", "metrics.jsonl"])
def test_a_fifo_in_one_run_blocks_nobody_and_makes_that_run_unknown(runs, on_stub_path, name):
    # Before: open() of the FIFO blocked `status` of all runs forever (and cancel, logs, report).
    cwd, good, bad = runs
    (bad / name).unlink(missing_ok=True)
    os.mkfifo(bad / name)
    result, took_s = _status_all(cwd, on_stub_path)
    assert took_s < DEADLINE_S
    row = _row(result, "bad/4242")
    assert row["state"] == "unknown" and "FIFO" in row["reason"], row
    assert _row(result, "good/local-1")["state"] == "queued"
    for command in (["cancel", "bad/4242"], ["logs", "bad/4242"], ["report", "bad"]):
        child = cli(*command, cwd=cwd, env=on_stub_path.env(), timeout=DEADLINE_S)
        assert child.returncode in (0, 2) and "Traceback" not in child.stderr, child.stderr
    # Which job a FIFO run.json names, or whether a cancel could be recorded, cannot be told: nothing is cancelled
    # (a FIFO metrics.jsonl is no obstacle to a cancel, which reads no metrics).
    assert on_stub_path.calls("scancel") == ([] if name != "metrics.jsonl" else ["4242"])


def test_cancel_never_appends_through_a_symlinked_state_log(runs, victim, on_stub_path):
    # Before: cancel appended its `cancelled` line into whatever file state.jsonl pointed at.
    cwd, _, bad = runs
    (bad / "state.jsonl").unlink()
    (bad / "state.jsonl").symlink_to(victim)
    result = invoke("cancel", "bad/4242", cwd=cwd)
    assert_clean_refusal(result, "is a symlink")
    assert victim.read_text() == "precious\n" and on_stub_path.calls("scancel") == []


def test_no_append_follows_a_symlink_or_a_symlinked_directory(tmp_path, victim):
    run_dir = tmp_path / "run"
    (run_dir / "elsewhere").mkdir(parents=True)
    (run_dir / "state.jsonl").symlink_to(victim)
    with pytest.raises(safe_files.RunFileError, match="is a symlink"):
        rundir.append_event(run_dir, rundir.CANCELLED)
    (run_dir / "logs").symlink_to(tmp_path)  # a planted directory link: logs/victim.txt is the victim
    with pytest.raises(safe_files.RunFileError, match="logs is a symlink"):
        safe_files.append_bytes(run_dir / "logs" / "victim.txt", b"x\n", within=run_dir)
    with pytest.raises(safe_files.RunFileError, match="logs is a symlink"):
        rundir.write_text_atomic(run_dir / "logs" / "victim.txt", "x\n", within=run_dir)
    assert victim.read_text() == "precious\n"


def test_submit_never_appends_through_a_symlinked_run_index(tmp_path, victim):
    # Before: register() appended the new run's line into the index symlink's target.
    run_dir = make_run(tmp_path / "runs", "job", "1")
    run_index.index_path().parent.mkdir(parents=True, exist_ok=True)
    run_index.index_path().symlink_to(victim)
    assert "is a symlink" in (run_index.register([run_dir], tmp_path) or "")
    assert victim.read_text() == "precious\n"


def test_a_log_path_outside_the_run_is_never_printed(runs, tmp_path, on_stub_path):
    # Before: `logs.batch: /etc/shadow` in a run.json made `hpc-train logs` print that file.
    cwd, _, bad = runs
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret\n")
    for recorded in (str(secret), str(bad / ".." / ".." / "secret.txt"), "/dev/zero"):
        record = json.loads((bad / "run.json").read_text())
        (bad / "run.json").write_text(json.dumps({**record, "logs": {"batch": recorded}}))
        result = invoke("logs", "bad/4242", cwd=cwd)
        assert_clean_refusal(result, "is outside the run's directory")
        assert "the secret" not in result.stdout


def test_device_files_and_symlinked_logs_are_refused_not_read(runs, victim):
    cwd, _, bad = runs
    (bad / "logs").mkdir()
    (bad / "logs" / "batch.log").symlink_to("/dev/zero")  # inside the run, but a link to a device
    record = json.loads((bad / "run.json").read_text())
    (bad / "run.json").write_text(json.dumps({**record, "logs": rundir.own_logs(bad)}))
    started = time.monotonic()
    result = invoke("logs", "bad/4242", cwd=cwd)
    assert time.monotonic() - started < DEADLINE_S
    assert_clean_refusal(result, "logs.batch")  # it resolves outside the run's directory
    (bad / "logs" / "batch.log").unlink()
    (bad / "logs" / "batch.log").symlink_to(bad / "job.yaml")  # a link that stays inside: still never followed
    assert_clean_refusal(invoke("logs", "bad/4242", cwd=cwd), "is a symlink")
    with pytest.raises(safe_files.RunFileError, match="a character device"):
        safe_files.read_bytes("/dev/zero")
    os.mkfifo(cwd / "fifo")
    with pytest.raises(safe_files.RunFileError, match="a FIFO"):
        safe_files.read_chunk(cwd / "fifo", 0)
    big = cwd / "big"
    with open(big, "wb") as handle:
        handle.truncate((1 << 20) + 1)
    with pytest.raises(safe_files.RunFileError, match="larger than 1 MiB"):
        safe_files.read_json(big)


WRONG_RECORDS = {"world_size": "two", "job_id": {"a": 1}, "logs": ["x"], "cluster": 7, "launcher_pid": "1",
                 "submitted_at": 5, "array_job_ids": [{"x": 1}]}


@pytest.mark.parametrize("key", sorted(WRONG_RECORDS))
def test_a_run_json_with_wrong_types_is_unknown_with_the_reason(runs, on_stub_path, key):
    cwd, _, bad = runs
    record = json.loads((bad / "run.json").read_text())
    (bad / "run.json").write_text(json.dumps({**record, key: WRONG_RECORDS[key]}))
    result = invoke("status", "--json", cwd=cwd)
    assert result.exit_code == 0, result.output
    rows = {r["run"]: r for r in json.loads(result.stdout)}
    assert rows["bad/4242"]["state"] == "unknown" and key in rows["bad/4242"]["reason"]
    assert rows["good/local-1"]["state"] == "queued"


@pytest.mark.parametrize("line", [{"event": "exit", "exit_code": "x"}, {"event": "running", "restart": "1"},
                                  {"event": "running", "instance": 5}, {"event": "completed", "epoch": [1]}])
def test_a_state_line_with_wrong_types_is_unknown_with_the_reason(runs, line):
    # Before: int("x") and friends were a traceback in everyone's `status`.
    cwd, good, _ = runs
    with open(good / "state.jsonl", "a") as handle:
        handle.write(json.dumps(line) + "\n")
    result = invoke("status", "--json", cwd=cwd)
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout) if r["run"] == "good/local-1")
    assert row["state"] == "unknown" and "state.jsonl line 2" in row["reason"]


@pytest.mark.parametrize("line", [{"epoch": 1, "top1": "high"}, {"epoch": 1, "top1": {"x": 1}},
                                  {"epoch": "one", "top1": 0.5}])
def test_a_metrics_line_with_wrong_types_is_unknown_with_the_reason(runs, line):
    cwd, good, _ = runs
    (good / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    result = invoke("status", "--json", cwd=cwd)
    assert result.exit_code == 0, result.output
    rows = {r["run"]: r for r in json.loads(result.stdout)}
    assert rows["good/local-1"]["state"] == "unknown" and "metrics.jsonl" in rows["good/local-1"]["reason"]
    assert "Traceback" not in result.output
    before = snapshot(cwd / "runs")
    assert invoke("report", "good", cwd=cwd).exit_code in (0, 2)
    assert snapshot(cwd / "runs") == before
