"""``status`` and ``report`` ask Slurm once for all their runs: on the real cluster, one squeue and one
sacct call answer a running job, the tasks of a pending-or-running array, a finished job and an id Slurm
never had, each exactly as the one-job lookup does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpc_train.runs.scheduler_job import SchedulerJob
from hpc_train.slurm import client as slurm
from tests.cluster import harness
from tests.real_cluster.test_lifecycle import wait_state

pytestmark = pytest.mark.timeout(300)


def _counting_shims(bin_dir: Path, log: Path) -> None:
    """squeue and sacct that log each call, then exec the real ones (Slurm answers, we only count)."""
    bin_dir.mkdir()
    for tool in ("squeue", "sacct"):
        real = harness.run_slurm(["sh", "-c", f"command -v {tool}"]).stdout.strip()
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} >> "{log}"\nexec "{real}" "$@"\n')
        (bin_dir / tool).chmod(0o755)


def test_one_squeue_and_one_sacct_answer_every_run(slurm_cluster, tmp_path, monkeypatch):
    env = slurm_cluster.env
    finished = harness.sbatch(["-N1", "-n1", "--wrap", "true"], env=env)
    running = harness.sbatch(["-N1", "-n1", "--wrap", "sleep 120"], env=env)
    array = harness.sbatch(["-N1", "-n1", "--array=0-2%1", "--wrap", "sleep 120"], env=env)
    try:
        assert harness.wait_job(finished, env=env) == "COMPLETED"
        harness.wait_sacct(finished, env=env)
        for job in (running, f"{array}_0"):  # settled: the two lookups below must see the same states
            wait_state(slurm_cluster, job, {"RUNNING"}, timeout_s=60)
        log = tmp_path / "calls.log"
        _counting_shims(tmp_path / "bin", log)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{env.get('PATH', os.environ['PATH'])}")
        ids = [finished, running, f"{array}_0", f"{array}_2", "999999"]

        together = slurm.job_states(ids + [running])  # a repeated id is asked once
        assert log.read_text().split() == ["squeue", "sacct"]
        log.unlink()
        one_by_one = {j: slurm.job_state(j) for j in ids}
        assert len(log.read_text().split()) >= len(ids)  # what the batch saves

        def view(s: SchedulerJob):  # elapsed times move between the two lookups
            return (s.job_id, s.state, s.source, s.reason if s.state == "UNKNOWN" else "")

        assert sorted(together) == sorted(ids)
        assert {j: view(s) for j, s in together.items()} == {j: view(s) for j, s in one_by_one.items()}
        assert (together[finished].state, together[finished].source) == ("COMPLETED", "sacct")
        assert together[running].source == together[f"{array}_2"].source == "squeue"
        assert together["999999"].state == "UNKNOWN"
    finally:
        harness.run_slurm(["scancel", running, array], env=env, check=False)
