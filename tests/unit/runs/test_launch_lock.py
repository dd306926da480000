"""One launch per run at a time (issue 28, item 2), with real processes: ``--resume`` of a live local run is exit 2
naming its job and the pid that holds its launch lock, and changes nothing; six resumes of one ended run raced at
once — exactly one wins; the ranks and the guard do not hold the lock; a refused ``--resume`` (a checkpoint-shaping
``--set``) leaves the run directory byte for byte as it was; and a refused submission puts back a file it had
replaced."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.errors import ConfigError
from hpc_train.runs import launch_lock
from hpc_train.runs.undo import Created
from tests.cli_helpers import assert_refused, cli
from tests.unit.local.supervision import (files, launcher_pid, leave_nothing, rank_pids, start_supervised, wait_ended,
                                          wait_until)


@pytest.fixture(autouse=True)
def _leave_nothing(tmp_path):
    yield
    leave_nothing(tmp_path)


def holds_lock(pid: int, run_dir: Path) -> bool:
    """Whether the process has the run's lock file open."""
    lock = str(run_dir / launch_lock.LOCK_FILE)
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fd) == lock for fd in fds.iterdir() if fds.exists())


def end(run_dir: Path, name: str, cwd: Path) -> None:
    pids = rank_pids(run_dir)
    assert cli("cancel", name, cwd=cwd).returncode == 0
    wait_ended(pids[::2])  # the ranks (their children are tests/unit/local/test_supervisor.py's)
    wait_until(lambda: launch_lock.holder(run_dir) is None, 30, "the lock released")


def test_resume_of_a_live_run_is_refused_naming_job_and_pid_and_changes_nothing(tmp_path):
    run_dir, name = start_supervised(tmp_path, ranks=1)
    runner = launcher_pid(run_dir)
    before = files(run_dir)
    result = cli("submit", "--cluster", "local", "--resume", name, cwd=tmp_path)
    assert_refused(result, f"{name} is live (job {run_dir.name}, pid {runner} holds .launch.lock)")
    assert files(run_dir) == before
    # The runner holds it; its ranks, their children and the guard do not (they would keep a dead run locked).
    assert holds_lock(runner, run_dir)
    children = [int(p) for task in Path(f"/proc/{runner}/task").iterdir() for p in (task / "children").read_text().split()]
    guard = [p for p in children if p not in rank_pids(run_dir)]
    assert len(guard) == 1 and not any(holds_lock(pid, run_dir) for pid in rank_pids(run_dir) + guard)
    end(run_dir, name, tmp_path)


def test_six_concurrent_resumes_of_an_ended_run_one_wins(tmp_path):
    run_dir, name = start_supervised(tmp_path, ranks=1)
    end(run_dir, name, tmp_path)
    command = [sys.executable, "-m", "hpc_train.cli", "submit", "--cluster", "local", "--resume", name, "--json"]
    racers = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(6)]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in racers]
    won = [r for r in results if r[0] == 0]
    lost = [r for r in results if r[0] != 0]
    assert len(won) == 1, results
    for code, _, err in lost:
        assert code == 2 and f"{name} is live (job {run_dir.name}, pid " in err, err
        assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
    events = [e["event"] for e in map(json.loads, (run_dir / "state.jsonl").read_text().splitlines())]
    assert events.count("queued") == 2  # the submission and the one resume that won
    wait_until(lambda: (run_dir / "pids-0.json").exists() and launch_lock.holder(run_dir), 60, "the resumed rank")
    end(run_dir, name, tmp_path)


def test_a_refused_resume_leaves_the_run_directory_as_it_was(tmp_path):
    run_dir, name = start_supervised(tmp_path, ranks=1)
    end(run_dir, name, tmp_path)
    before = files(run_dir)
    result = cli("submit", "--cluster", "local", "--resume", name, "--set", "train.model.name=resnet32", cwd=tmp_path)
    assert_refused(result, f"--resume {name} cannot change train.model.name ('small_cnn' -> 'resnet32')")
    assert files(run_dir) == before


def test_a_refused_submission_puts_back_a_file_it_had_replaced(tmp_path):
    (tmp_path / "job.yaml").write_text("old\n")
    created = Created()
    created.write(tmp_path / "job.yaml", "new\n")
    try:
        created.write(tmp_path / "missing" / "x", "y")  # cannot be written: undoes everything
    except ConfigError:
        pass
    assert (tmp_path / "job.yaml").read_text() == "old\n"
