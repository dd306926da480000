"""#SBATCH values reach Slurm exactly as the job wrote them (issue 19, item 1's #SBATCH context): sbatch reads
its own option lines — quotes, and a backslash as an escape even inside quotes — so the `sbatch` filter quotes
for that reader. Checked against the real sbatch and squeue of the harness: a held job, never run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc_train.config import SiteConfig, resolve_job
from hpc_train.render import render_sbatch

pytestmark = pytest.mark.timeout(300)

NAME = "it's a \\ job"
COMMENT = "a \"b\" 'c' \\ $(touch P) #d"


def test_sbatch_values_arrive_as_written(slurm_cluster, tmp_path):
    spec, _ = resolve_job(None, site=SiteConfig(None, {}, ()), flags={"name": NAME},
                          sets=["slurm.time=00:05:00", "slurm.partition=gpu", f"slurm.extra_sbatch={{comment: {json.dumps(COMMENT)}}}"])
    assert spec.slurm.extra_sbatch["comment"] == COMMENT
    script = tmp_path / "held.sbatch"
    script.write_text(render_sbatch(spec, runs_root=str(tmp_path / "runs"), python=sys.executable))
    submitted = subprocess.run(["sbatch", "--hold", "--parsable", str(script)], capture_output=True, text=True,
                               cwd=tmp_path, env=slurm_cluster.env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        shown = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%j|%k"], capture_output=True, text=True,
                               env=slurm_cluster.env, check=True).stdout.rstrip("\n")
        assert shown == f"{NAME}|{COMMENT}"
    finally:
        subprocess.run(["scancel", job_id], env=slurm_cluster.env, check=False)
    assert not (tmp_path / "P").exists()
