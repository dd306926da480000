"""Where a client's files go (issue 27 item 4), with the real local launcher: a command runs in its run's own
``<run_dir>/work`` (``workdir: run``, the default), so a client that keeps ``snapshot.pt`` in its working
directory (the PyTorch DDP tutorial) resumes its own run after a requeue and a ``--resume``, and a new run never
finds another run's snapshot (``workdir: submit``, the submit directory: tests/unit/rank/test_command.py, with
the wrapper every launcher starts). A missing program after ``--``
(issue 28 item 8) is exit 2 at submit with nothing written, not python's own 2 once the ranks ran. The same on
the Slurm cluster: tests/real_cluster/test_commands.py; the wrapper's exit 127: tests/unit/rank/test_command.py."""

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import assert_refused, cli

CLIENT = Path(__file__).resolve().parents[2] / "scripts" / "snapshot_in_cwd.py"


def seen(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "seen.jsonl").read_text().splitlines()]


def submit(tmp_path: Path, *args: str) -> dict:
    """A 2-rank local run of the client, as typed from ``tmp_path`` (its script path relative), to the end."""
    result = cli("submit", "--cluster", "local", "--tasks-per-node", "2", "--json", "--wait", *args, cwd=tmp_path,
                 timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_a_new_run_never_finds_another_runs_snapshot_and_a_requeue_or_resume_finds_its_own(tmp_path):
    shutil.copy(CLIENT, tmp_path / "client.py")
    first = submit(tmp_path, "--", "python", "client.py", "once")  # relative: still the submit directory's script
    second = submit(tmp_path, "--", "python", "client.py")  # exit 75 without a snapshot: launched again
    again = cli("submit", "--cluster", "local", "--resume", second["run_name"], "--wait", cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr

    runs = ((first, 1), (second, 3))
    # The first start of each run finds nothing (on main the second run found the first's snapshots); the
    # requeue (exit 75) and the --resume find this run's own.
    assert [[s["found"] for s in seen(Path(run["run_dir"]))] for run, _ in runs] == \
        [[None, None] + [Path(run["run_dir"]).name] * (2 * launches - 2) for run, launches in runs]
    for run, _ in runs:
        work = str(Path(run["run_dir"]) / "work")
        starts = seen(Path(run["run_dir"]))
        assert {s["cwd"] for s in starts} == {work} and {s["submit_dir"] for s in starts} == {str(tmp_path)}
        status = json.loads(cli("status", run["run_name"], "--json", cwd=tmp_path).stdout)
        assert status["state"] == "completed" and status["workdir"] == work
        assert json.loads((Path(run["run_dir"]) / "run.json").read_text())["workdir"] == work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.py", "runs"]  # nothing in the submit directory
    # Resumed from another directory, `client.py` would be another file: refused, naming both, nothing changed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "client.py").write_text("raise SystemExit('another client')\n")
    before = (Path(second["run_dir"]) / "run.json").read_text()
    moved = cli("submit", "--cluster", "local", "--resume", second["run_dir"], "--dry-run", cwd=elsewhere, timeout=60)
    assert_refused(moved, f"this run was submitted from {tmp_path}")
    assert (Path(second["run_dir"]) / "run.json").read_text() == before and [p.name for p in elsewhere.iterdir()] == ["client.py"]


@pytest.mark.parametrize("command, missing", [
    (["python", "missing.py"], "missing.py"),
    (["python", "-u", "-W", "ignore", "sub/missing.py", "--lr", "1"], "sub/missing.py"),
    (["./missing.sh"], "./missing.sh"),
    (["no-such-program-hpc-train"], "no-such-program-hpc-train"),
    (["python", "/nonexistent/missing.py"], "/nonexistent/missing.py"),
])
def test_a_missing_program_is_refused_at_submit_with_nothing_written(tmp_path, command, missing):
    result = cli("submit", "--cluster", "local", "--", *command, cwd=tmp_path)
    assert_refused(result, f"program not found: {missing}")
    assert list(tmp_path.iterdir()) == []  # no runs directory: nothing queued, nothing started
