"""``cancel`` of a ``train`` run alone (``hpc-train train JOB``, no submit; issue 28, item 8): it recorded
``cancelled`` and left the process training. Now it is the same contract as cancelling a local launch: only a
process of the run is signalled (this user's, carrying the run directory in its environment), SIGTERM, it
checkpoints, and the run is ``cancelled`` saying so. A real trainer process and real signals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hpc_train.runs import rundir
from tests.cli_helpers import assert_refused, cli

DEADLINE_S = 180.0  # a trainer's start (the torch import) on two busy cores


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / rundir.STATE_LOG
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(what, condition, proc=None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        assert proc is None or proc.poll() is None, f"the trainer ended before {what}: exit {proc.returncode}"
        time.sleep(0.2)
    raise AssertionError(f"not within {DEADLINE_S:.0f} s: {what}")


def test_cancel_of_a_train_run_alone_stops_it_after_a_checkpoint(tmp_path, isolated_launch_env):
    proc = subprocess.Popen([sys.executable, "-m", "hpc_train.cli", "train", "digits_lt_demo", "--set",
                             "train.epochs=500", "--set", "train.schedule.warmup_epochs=0", "--set",
                             "slurm.tasks_per_node=1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        group = tmp_path / "runs" / "digits-lt-demo"
        run_dir = _wait_for("a run directory", lambda: next(iter(group.glob("local-*")), None) if group.is_dir()
                            else None, proc)
        _wait_for("the trainer's running line", lambda: any(e.get("writer") == "trainer" for e in _events(run_dir)),
                  proc)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert f"{rundir.RUN_DIR_ENV}={run_dir}".encode() in environ  # what cancel checks before it signals
        done = cli("cancel", str(run_dir), cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "checkpointed (exit 75)" in done.stdout, done.stdout
        assert proc.wait(timeout=5) == rundir.EXIT_CHECKPOINTED  # it had ended when cancel returned
        shown = json.loads(cli("status", str(run_dir), "--json", cwd=tmp_path).stdout)
        assert shown["state"] == "cancelled" and "it checkpointed (exit 75)" in shown["reason"], shown
        assert list((run_dir / "checkpoints").glob("ckpt-*.pt"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cancel_signals_no_process_that_is_not_the_runs(tmp_path):
    # rank-0.json in a shared directory names a pid: a process of this user that does not carry the run directory
    # in its environment (here: one whose command line looks like a trainer's) is not signalled, nothing recorded.
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "hpc_train.train"],
                             env={k: v for k, v in os.environ.items() if k != rundir.RUN_DIR_ENV})
    try:
        run_dir = tmp_path / "runs" / "demo" / "local-20260101-000000"
        (run_dir / rundir.RANKS_DIR).mkdir(parents=True)
        (run_dir / rundir.JOB_YAML).write_text("name: demo\n")
        (run_dir / rundir.RANKS_DIR / "rank-0.json").write_text(json.dumps({"rank": 0, "pid": decoy.pid}))
        rundir.append_event(run_dir, rundir.RUNNING, writer="trainer", instance=f"pid:{decoy.pid}", restart=0)
        before = (run_dir / rundir.STATE_LOG).read_text()
        done = cli("cancel", str(run_dir), cwd=tmp_path)
        assert_refused(done, "does not carry")
        assert decoy.poll() is None and (run_dir / rundir.STATE_LOG).read_text() == before
    finally:
        decoy.kill()
        decoy.wait()
