"""The run directory's states: the lines each writer appends, how they fold into one state, the sbatch
script's own lines (its exit block run in bash with a stand-in srun), and the reconciliation with Slurm
for what no exit block sees."""

import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.config import NO_SITE, resolve_job
from hpc_train.render import render_sbatch
from hpc_train.runs import rundir
from hpc_train.runs.status import reconcile
from hpc_train.slurm.client import slurm_job


def line(event, instance=None, **fields):
    return {"event": event, **({"instance": instance} if instance else {}), **fields}


@pytest.mark.parametrize("events,state,reason,code", [
    ([line("queued")], "queued", "", None),
    ([line("queued"), line("running", "slurm:7.0", writer="launcher")], "running", "", None),
    ([line("running", "slurm:7.0"), line("completed", "slurm:7.0", exit_code=0), line("exit", "slurm:7.0", exit_code=0)],
     "completed", "", 0),
    # A rank's reason survives the launch's exit code; the first failing rank is the reason.
    ([line("running", "slurm:7.0"), line("failed", "slurm:7.0", reason="bad data", exit_code=2),
      line("failed", "slurm:7.0", reason="bad data too"), line("exit", "slurm:7.0", exit_code=2)],
     "failed", "bad data", 2),
    # ...and its exit code survives a launch that ended with another rank's (killed by srun: 143).
    ([line("running", "slurm:7.0"), line("failed", "slurm:7.0", reason="bad data", exit_code=2),
      line("exit", "slurm:7.0", exit_code=143)], "failed", "bad data", 2),
    # Nothing but an exit code (a crash the rank could not report, or a user command).
    ([line("running", "slurm:7.0"), line("exit", "slurm:7.0", exit_code=3)], "failed", "exit code 3", 3),
    ([line("running", "slurm:7.0"), line("exit", "slurm:7.0", exit_code=137)], "failed", "killed by signal 9 (exit 137)", 137),
    ([line("running", "slurm:7.0"), line("preempted", "slurm:7.0", exit_code=75), line("exit", "slurm:7.0", exit_code=75)],
     "preempted", "", 75),
    ([line("running", "slurm:7.0"), line("exit", "slurm:7.0", exit_code=75)], "preempted", "checkpointed, not requeued", 75),
    # Requeued: the next launch of the same job id starts afresh (restart 1).
    ([line("running", "slurm:7.0"), line("requeued", "slurm:7.0", exit_code=0), line("exit", "slurm:7.0", exit_code=0)],
     "requeued", "", 0),
    ([line("running", "slurm:7.0"), line("requeued", "slurm:7.0"), line("running", "slurm:7.1", restart=1)],
     "running", "", None),
    # A cancel is final for that launch: what its ranks record afterwards does not undo it...
    ([line("running", "slurm:7.0"), line("cancelled", reason="by the user"), line("preempted", "slurm:7.0"),
      line("exit", "slurm:7.0", exit_code=143)], "cancelled", "by the user", None),
    # ...but a new launch (--resume) does.
    ([line("running", "slurm:7.0"), line("cancelled"), line("running", "slurm:9.0"), line("exit", "slurm:9.0", exit_code=0)],
     "completed", "", 0),
    # ...and so does the new job's queued line, before its launch starts (issue 19, item 8: --wait saw
    # "cancelled" at once, and the local launcher refused to start the continuation).
    ([line("running", "local:x.0"), line("cancelled", reason="by the user"), line("queued", writer="submit")],
     "queued", "", None),
    ([line("running", "local:x.0"), line("exit", "local:x.0", exit_code=75), line("queued", writer="submit")],
     "queued", "", None),
    # A chain queues all its jobs at once: their queued lines change nothing.
    ([line("queued"), line("queued"), line("running", "slurm:7.0")], "running", "", None),
    # A failure recorded by one rank is not undone by rank 0 starting to train later in the same launch.
    ([line("failed", "slurm:7.0", reason="rank 3 died"), line("running", "slurm:7.0", writer="trainer")],
     "failed", "rank 3 died", None),
])
def test_state_lines_fold_into_one_state(events, state, reason, code):
    folded = rundir.fold(events)
    assert (folded.state, folded.reason, folded.exit_code) == (state, reason, code)


def test_progress_and_restarts_come_from_the_latest_lines():
    folded = rundir.fold([line("running", "slurm:7.0"), line("running", "slurm:7.1", restart=1, epoch=3, global_step=30),
                          line("completed", "slurm:7.1", epoch=5, global_step=50, total_epochs=5)])
    assert folded.restart == 1 and dict(folded.progress) == {"epoch": 5, "global_step": 50, "total_epochs": 5}


def test_a_torn_or_foreign_line_is_skipped(tmp_path):
    (tmp_path / rundir.STATE_LOG).write_text('{"event": "queued"}\nnot json\n{"no": "event"}\n{"event": "running"')
    assert rundir.read_state(tmp_path).state == "queued"


# ------------------------------------------------------------------------------------------------
# The sbatch script's lines: its exit block, run in bash with a stand-in srun
# ------------------------------------------------------------------------------------------------

SRUN = """#!/bin/bash
# Stands in for srun: optionally records a trainer line the way rank 0 would, then exits as told.
if [ -n "$TRAINER_EVENT" ]; then
    printf '{"event": "%s", "writer": "trainer", "instance": "slurm:%s.0"}\\n' "$TRAINER_EVENT" "$SLURM_JOB_ID" \\
        >> "$HPC_TRAIN_RUN_DIR/state.jsonl"
fi
exit "$SRUN_EXIT"
"""


@pytest.mark.parametrize("srun_exit,trainer_event,script_exit,state", [
    (0, "completed", 0, "completed"),
    (3, "", 3, "failed"),
    (1, "preempted", 75, "preempted"),  # killed ranks' codes do not hide a checkpoint that was not requeued
    (0, "requeued", 0, "requeued"),
])
def test_the_scripts_exit_block_records_how_the_launch_ended(tmp_path, srun_exit, trainer_event, script_exit, state):
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.python=" + sys.executable])
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec, runs_root=str(tmp_path / "runs"), python=sys.executable))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "node01", "SLURM_CPUS_PER_TASK": "1", "SRUN_EXIT": str(srun_exit),
           "TRAINER_EVENT": trainer_event}
    result = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == script_exit, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / spec.name / "4242"
    events = rundir.read_events(run_dir)
    assert events[0]["event"] == "running" and events[0]["instance"] == "slurm:4242.0"
    assert events[-1] == {**events[-1], "event": "exit", "exit_code": script_exit, "writer": "launcher"}
    assert rundir.read_state(run_dir).state == state


# ------------------------------------------------------------------------------------------------
# Reconciliation with Slurm (the job's state as squeue/sacct give it)
# ------------------------------------------------------------------------------------------------

RUNNING = rundir.RunState(state="running")
PREEMPTED = rundir.RunState(state="preempted", reason="checkpointed, not requeued", exit_code=75)
FAILED_BY_RANK = rundir.RunState(state="failed", reason="bad data", exit_code=2)
REQUEUED = rundir.RunState(state="requeued")


@pytest.mark.parametrize("recorded,slurm,expected", [
    (RUNNING, slurm_job("7", "TIMEOUT", exit_code="0:15"), ("failed", "time limit reached (Slurm: TIMEOUT 0:15)")),
    (RUNNING, slurm_job("7", "OUT_OF_MEMORY", exit_code="0:125"), ("failed", "out of memory (Slurm: OUT_OF_MEMORY 0:125)")),
    (RUNNING, slurm_job("7", "NODE_FAIL", exit_code="1:0"), ("failed", "a node failed (Slurm: NODE_FAIL 1:0)")),
    (RUNNING, slurm_job("7", "CANCELLED", exit_code="0:0"), ("cancelled", "cancelled (Slurm: CANCELLED 0:0)")),
    (PREEMPTED, slurm_job("7", "TIMEOUT", exit_code="0:15"), ("preempted", "checkpointed (Slurm: TIMEOUT 0:15)")),
    (PREEMPTED, slurm_job("7", "FAILED", exit_code="75:0"), ("preempted", "checkpointed, not requeued")),
    (FAILED_BY_RANK, slurm_job("7", "FAILED", exit_code="2:0"), ("failed", "bad data")),
    (RUNNING, slurm_job("7", "FAILED", exit_code="1:0"), ("failed", "Slurm: FAILED 1:0")),
    (rundir.RunState(state=None), slurm_job("7", "COMPLETED", exit_code="0:0"), ("completed", "")),
    (REQUEUED, slurm_job("7", "PENDING", reason="BeginTime"), ("requeued", "BeginTime")),
    (rundir.RunState(state="queued"), slurm_job("7", "PENDING", reason="Priority"), ("queued", "Priority")),
    (REQUEUED, slurm_job("7", "RUNNING"), ("running", "")),
    (FAILED_BY_RANK, slurm_job("7", "UNKNOWN", reason="not in squeue; sacct: Slurm accounting storage is disabled"),
     ("failed", "bad data")),
    (rundir.RunState(state=None), slurm_job("7", "UNKNOWN", reason="not in squeue; sacct: Slurm accounting storage is "
                                                                  "disabled"),
     ("unknown", "not in squeue; sacct: Slurm accounting storage is disabled")),
])
def test_status_reconciles_with_slurm_for_what_no_exit_block_sees(recorded, slurm, expected):
    assert reconcile(recorded, slurm) == expected


def test_runs_root_refuses_percent(tmp_path):
    from hpc_train.errors import ConfigError

    assert rundir.runs_root("runs", tmp_path) == tmp_path / "runs"
    with pytest.raises(ConfigError, match="holds '%'"):
        rundir.runs_root("runs", Path("/home/u/100%"))
