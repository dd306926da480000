"""What every hostile case checks, in-process (click's runner: no interpreter start per case): a clean refusal is
exit 2 with one or two lines on stderr and no traceback, and leaves the runs directory and the run index as they
were, with no Slurm tool called (the stand-ins of tests/conftest.py record every call)."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpc_train.cli import main


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def invoke(*args: str, cwd: Path | None = None) -> Result:
    """``hpc-train ARGS`` in this process, from ``cwd``, through the console entry point (``main``: usage errors
    in two lines, as users see them); an exception that escapes it is the result's ``exception`` (a traceback)."""
    before = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    code, escaped = 0, None
    if cwd is not None:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(args))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - what a user would see as a traceback
        code, escaped = 1, exc
    finally:
        os.chdir(before)
        gc.unfreeze()  # main() freezes what it made: a test process runs hundreds of commands
    return Result(code, out.getvalue(), err.getvalue(), escaped)


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
    assert result.exception is None, shown
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
