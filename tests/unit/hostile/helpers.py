"""What every hostile case checks, in-process (click's runner: no interpreter start per case): a clean refusal is
exit 2 with one or two lines on stderr and no traceback, and leaves the runs directory and the run index as they
were, with no Slurm tool called (the stand-ins of tests/conftest.py record every call)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from click.testing import CliRunner

from hpc_train.cli import cli


def invoke(*args: str, cwd: Path | None = None):
    """``hpc-train ARGS`` in this process, from ``cwd``."""
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args))
    finally:
        os.chdir(before)


def snapshot(*roots: Path) -> dict[str, str]:
    """Every path under ``roots`` with a digest of what it holds (what a refused command must leave as it was)."""
    seen: dict[str, str] = {}
    for root in roots:
        for path in sorted(root.rglob("*")) if root.exists() else []:
            if path.is_symlink():
                seen[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                seen[str(path)] = "dir" if path.is_dir() else "other"
    return seen


def assert_clean_refusal(result, message: str = "") -> None:
    """exit 2, one or two lines on stderr saying ``message``, no traceback."""
    shown = f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}\n{result.exception!r}"
    assert result.exit_code == 2, shown
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert "Traceback" not in result.stdout + result.stderr, shown
    assert 1 <= len(result.stderr.strip().splitlines()) <= 2, shown
    assert message in result.stderr, shown


def make_run(root: Path, job: str, run_id: str, cluster: str = "slurm", when: str = "2026-01-01T00:00:00+00:00",
             **record) -> Path:
    """A run directory as submit leaves it: run.json, job.yaml and a ``queued`` line."""
    run_dir = root / job / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": run_id, "cluster": cluster, "submitted_at": when,
                                                  "world_size": 1, **record}))
    (run_dir / "job.yaml").write_text(f"name: {job}\n")
    (run_dir / "state.jsonl").write_text(json.dumps({"event": "queued", "time": when}) + "\n")
    return run_dir
