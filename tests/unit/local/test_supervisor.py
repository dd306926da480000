"""The local launcher supervises its ranks as slurmstepd does (issue 28, item 1), with real processes and signals:
whatever ends the launcher — SIGKILL, SIGTERM, SIGINT — no process of its ranks (the rank, and a child of its own)
is alive 30 s later, and the run's state says what happened; SIGTERM and SIGINT reach the ranks as scancel's
SIGTERM does (they checkpoint and exit 75: ``cancelled``, continue with --resume). And when the launcher and its
guard are both killed, the ranks die with their parent (the parent-death signal), ``status`` names the processes
they left, ``--resume`` is refused, and ``cancel`` ends them. The ranks are torch-free (tests/scripts/supervised_rank.py)."""

import datetime as dt
import json
import os
import signal

import pytest

from hpc_train.runs.report import launch_seconds
from tests.cli_helpers import assert_refused, cli
from tests.unit.local.supervision import (alive, launcher_pid, leave_nothing, rank_pids, start_supervised,
                                          wait_ended,
                                          wait_until)


@pytest.fixture(autouse=True)
def _leave_nothing(tmp_path):
    yield
    leave_nothing(tmp_path)


def status(cwd, name):
    return json.loads(cli("status", name, "--json", cwd=cwd).stdout)


def test_a_sigkilled_launcher_leaves_no_rank_and_its_run_failed_naming_it(tmp_path):
    run_dir, name = start_supervised(tmp_path)
    pids, launcher = rank_pids(run_dir), launcher_pid(run_dir)
    os.kill(launcher, signal.SIGKILL)
    wait_ended(pids)
    # The guard records it (the launcher could not): failed, naming the launcher and its ranks.
    found = wait_until(lambda: status(tmp_path, name)["state"] == "failed" and status(tmp_path, name), 30,
                       "the run recorded failed")
    assert f"the local launcher (pid {launcher}) died before its ranks ended" in found["reason"], found
    assert not list(run_dir.glob("checkpoint-*"))  # SIGKILL: no rank was asked to checkpoint


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_sigterm_or_sigint_to_the_launcher_reach_the_ranks_as_scancel_does(tmp_path, signum):
    run_dir, name = start_supervised(tmp_path)
    pids = rank_pids(run_dir)
    os.kill(launcher_pid(run_dir), signum)
    wait_ended(pids)
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-1"]
    found = wait_until(lambda: status(tmp_path, name)["state"] == "cancelled" and status(tmp_path, name), 30,
                       "the run recorded cancelled")
    assert found["reason"] == f"the local launcher got {signum.name}; the ranks checkpointed (exit 75)", found
    assert found["hint"] == f"continue it with: hpc-train submit --resume {name}"
    assert f"the local launcher got {signum.name}: sending SIGTERM to the ranks" in (run_dir / "logs/batch.log").read_text()


def test_ranks_die_with_their_launcher_and_cancel_ends_what_they_left(tmp_path):
    # The launcher and its guard killed at once (the runner's whole process group): only the parent-death signal
    # is left, and it ends the ranks, not the children they started (in each rank's own process group).
    run_dir, name = start_supervised(tmp_path)
    records = [json.loads((run_dir / f"pids-{r}.json").read_text()) for r in range(2)]
    os.killpg(launcher_pid(run_dir), signal.SIGKILL)
    wait_ended([r["rank"] for r in records])
    children = [r["child"] for r in records]
    assert all(alive(c) for c in children)
    found = status(tmp_path, name)
    assert found["state"] == "running" and "processes of its ranks still run" in found["reason"], found
    assert all(str(c) in found["reason"] for c in children)
    assert_refused(cli("submit", "--cluster", "local", "--resume", name, cwd=tmp_path), f"{name} is running (job ")
    result = cli("cancel", name, cwd=tmp_path)
    assert result.returncode == 0 and "ended 2 process(es) its dead launcher left" in result.stdout, result.stdout
    wait_ended(children)
    assert status(tmp_path, name)["state"] == "cancelled"


def test_a_launch_under_way_after_its_ranks_line_counts_to_now():
    # The launcher's `ranks` line is the last one of a running command's launch: `report` still counts it as live.
    events = [{"event": "running", "writer": "launcher", "instance": "local:r.0", "time": "2026-01-01T00:00:00+00:00"},
              {"event": "ranks", "writer": "launcher", "instance": "local:r.0", "time": "2026-01-01T00:00:00+00:00"}]
    started = dt.datetime.fromisoformat(events[0]["time"]).timestamp()
    assert launch_seconds(events, now=started + 60) == 60
