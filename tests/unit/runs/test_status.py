"""runs/status.py folds a scheduler's view of a job, in neutral words (runs/scheduler_job.py), with what the run
directory recorded — no scheduler is asked and none is named but the one the view says. Slurm's own states are
mapped onto this view in slurm/client.py (tests/unit/runs/test_run_states.py checks the two together)."""

from __future__ import annotations

import pytest

from hpc_train.runs import rundir
from hpc_train.runs.index import Run
from hpc_train.runs.scheduler_job import SchedulerJob
from hpc_train.runs.status import reconcile, run_state

RUNNING = rundir.RunState(state="running")
CHECKPOINTED = rundir.RunState(state="preempted", reason="checkpointed, not requeued", exit_code=75)


def job(state: str, phase, **fields) -> SchedulerJob:
    return SchedulerJob("9", state, phase, scheduler="Flux", **fields)


@pytest.mark.parametrize("recorded, view, expected", [
    (RUNNING, job("WALLTIME", "ended", ended_by="time_limit", cause="time limit reached", exit_code="271"),
     ("failed", "time limit reached (Flux: WALLTIME 271)")),
    (CHECKPOINTED, job("WALLTIME", "ended", ended_by="time_limit", cause="time limit reached"),
     ("preempted", "checkpointed (Flux: WALLTIME)")),
    (CHECKPOINTED, job("KILLED", "ended", ended_by="cancel", cause="cancelled"), ("cancelled", "checkpointed (Flux: KILLED)")),
    (CHECKPOINTED, job("OOM", "ended", ended_by="failure", cause="out of memory"), ("failed", "out of memory (Flux: OOM)")),
    (RUNNING, job("DONE", "ended", succeeded=True, exit_code="0"), ("completed", "")),
    (RUNNING, job("EXITED", "ended", exit_code="3"), ("failed", "Flux: EXITED 3")),
    (rundir.RunState(state="queued"), job("WAIT", "queued", reason="priority"), ("queued", "priority")),
    (rundir.RunState(state="queued"), job("WAIT", "requeued", reason="held"), ("requeued", "held")),
    (RUNNING, job("RUN", "running"), ("running", "")),
    (RUNNING, job("?", "unknown", reason="no Flux here", answered=False), ("unknown", "no Flux here (last recorded: running)")),
    (RUNNING, job("?", "unknown", reason="not in the accounting"), ("running", "")),
])
def test_a_schedulers_view_folds_with_the_run_directory(recorded, view, expected):
    assert reconcile(recorded, view) == expected


def test_a_local_run_is_failed_once_its_runner_is_gone_without_a_word(tmp_path):
    (tmp_path / "state.jsonl").write_text('{"event": "queued"}\n{"event": "running", "instance": "local:a.0"}\n')
    gone = 2 ** 22 + 7  # above the default pid_max: no process has it
    run = Run(tmp_path, {"cluster": "local", "launcher_pid": gone, "job_id": "local-1"})
    assert run_state(run, None) == ("failed", f"its local launcher (pid {gone}) ended without recording how the run ended")
