"""Helpers of the supervision and launch-lock tests: a local run of tests/scripts/supervised_rank.py, its
processes, and waiting for them to end."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.cli_helpers import cli

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
ENDED_WITHIN_S = 30.0


def alive(pid: int) -> bool:
    """The process runs (a zombie has ended: only its exit status waits to be read)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def start_supervised(cwd: Path, ranks: int = 2) -> tuple[Path, str]:
    """Submit a local run of ``ranks`` supervised ranks; its run directory and run name once every rank runs."""
    result = cli("submit", "--cluster", "local", "--tasks-per-node", str(ranks), "--json", "--", sys.executable,
                 str(SCRIPTS / "supervised_rank.py"), cwd=cwd)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    run_dir = Path(cwd, out["run_dir"])
    wait_until(lambda: all((run_dir / f"pids-{r}.json").exists() for r in range(ranks)), 60, "the ranks started")
    return run_dir, out["run_name"]


def rank_pids(run_dir: Path) -> list[int]:
    """Every rank's pid and its child's (what must not outlive the launch)."""
    pids = []
    for path in sorted(run_dir.glob("pids-*.json")):
        record = json.loads(path.read_text())
        pids += [record["rank"], record["child"]]
    return pids


def launcher_pid(run_dir: Path) -> int:
    return int(json.loads((run_dir / "run.json").read_text())["launcher_pid"])


def wait_ended(pids: list[int], timeout_s: float = ENDED_WITHIN_S) -> None:
    wait_until(lambda: not [p for p in pids if alive(p)], timeout_s,
               f"no process of the run alive (still: {[p for p in pids if alive(p)]})")


def files(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory with its bytes (what a refused command must leave as it was)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def leave_nothing(cwd: Path) -> None:
    """After a test, failed or not: SIGKILL whatever its runs left (ranks, their children, runners)."""
    for run_json in Path(cwd).glob("runs/*/*/run.json"):
        pids = rank_pids(run_json.parent) + [launcher_pid(run_json.parent)]
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if alive(pid) and (b"supervised_rank" in cmdline or b"sleep" in cmdline or b"hpc_train" in cmdline):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
