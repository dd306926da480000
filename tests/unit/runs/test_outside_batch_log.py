"""A plain ``sbatch`` of a rendered script links ``logs/batch.log`` to the template's ``#SBATCH --output``, which an
admin may put outside the job's directory: ``logs`` prints the rank logs and says where the batch log is, without
reading it (hpc-train reads only files under the job's directory); any other recorded path outside stays an error."""

from __future__ import annotations

import pytest

from hpc_train.runs import rundir, safe_files
from hpc_train.runs.index import Run
from hpc_train.runs.status import follow_logs


def _plain_run(tmp_path):
    run_dir = tmp_path / "runs" / "plain-admin" / "38"
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True)
    (run_dir / rundir.RANK_LOG.format(rank=0)).write_text("hello from rank 0\n")
    outside = tmp_path / "slurm-38.out"
    outside.write_text("secret batch output\n")
    (run_dir / rundir.BATCH_LOG).symlink_to(outside)
    logs = {"batch": str(run_dir / rundir.BATCH_LOG), "rank_out": str(run_dir / rundir.RANK_LOG)}
    return Run(run_dir, {"job_id": "38", "world_size": 1, "logs": logs}), outside


def test_a_linked_batch_log_outside_is_named_not_read(tmp_path):
    run, outside = _plain_run(tmp_path)
    lines = list(follow_logs(run, None, follow=False))
    assert lines == [f"[batch] the batch log is {outside}, outside the job's directory: not read here",
                     "[rank 0] hello from rank 0"], lines


def test_another_recorded_path_outside_is_still_refused(tmp_path):
    run, outside = _plain_run(tmp_path)
    run = Run(run.run_dir, {**run.record, "logs": {**run.record["logs"], "batch": str(outside)}})
    with pytest.raises(safe_files.RunFileError):
        list(follow_logs(run, None, follow=False))
