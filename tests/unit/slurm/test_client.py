"""slurm/client.py says once what Slurm's states mean for a run, in the neutral view runs/ folds
(runs/scheduler_job.py)."""

from __future__ import annotations

import pytest

from hpc_train.slurm.client import NO_SLURM, slurm_job


@pytest.mark.parametrize("state, phase", [
    ("PENDING", "queued"), ("REQUEUED", "requeued"), ("REQUEUE_HOLD", "requeued"), ("RUNNING", "running"),
    ("COMPLETING", "running"), ("SUSPENDED", "queued"), ("COMPLETED", "ended"), ("TIMEOUT", "ended"),
    ("UNKNOWN", "unknown"),
])
def test_each_slurm_state_has_a_phase(state, phase):
    assert slurm_job("7", state).phase == phase


def test_what_slurm_ended_itself_is_said_with_why():
    assert (slurm_job("7", "TIMEOUT").ended_by, slurm_job("7", "TIMEOUT").cause) == ("time_limit", "time limit reached")
    assert slurm_job("7", "PREEMPTED").ended_by == "preemption" and slurm_job("7", "CANCELLED").ended_by == "cancel"
    assert slurm_job("7", "NODE_FAIL").ended_by == "failure"
    failed = slurm_job("7", "FAILED", exit_code="1:0")  # the job's own exit: no ending of Slurm's
    assert failed.ended_by is None and not failed.succeeded and failed.said == "FAILED 1:0"
    done = slurm_job("7", "COMPLETED", exit_code="0:0")
    assert done.succeeded and done.said == "COMPLETED"


def test_a_slurm_that_could_not_be_asked_is_told_from_one_that_forgot_the_job():
    assert not slurm_job("7", "UNKNOWN", reason=NO_SLURM).answered
    assert not slurm_job("7", "UNKNOWN", reason="squeue failed: Unable to contact slurm controller").answered
    assert slurm_job("7", "UNKNOWN", reason="not in squeue, and sacct has no record of it").answered
