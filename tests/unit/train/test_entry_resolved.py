"""The sbatch script runs `python -m hpc_train.train --resolved $RUN_DIR/job.yaml`: a fully resolved job
must not be layered over a site file again — on a compute node $HPC_TRAIN_SITE may name a file that only
the login node has."""

import os
import subprocess
import sys

from hpc_train.config import SiteConfig, dump_yaml, resolve_job


def test_resolved_job_ignores_the_site_file(tmp_path):
    spec, _ = resolve_job(None, site=SiteConfig(None, {}, ()), sets=["train.device=cpu", "slurm.tasks_per_node=1"])
    job = tmp_path / "job.yaml"
    job.write_text(dump_yaml(spec))
    env = {**os.environ, "HPC_TRAIN_SITE": str(tmp_path / "only-on-the-login-node.yaml")}
    env.pop("SLURM_JOB_ID", None)
    base = [sys.executable, "-m", "hpc_train.train", str(job), "--dry-run", "--run-dir", str(tmp_path / "run")]
    layered = subprocess.run(base, capture_output=True, text=True, env=env, timeout=300)
    assert layered.returncode == 2 and "site file not found" in layered.stderr
    resolved = subprocess.run([*base, "--resolved"], capture_output=True, text=True, env=env, timeout=300)
    assert resolved.returncode == 0, resolved.stderr
    assert "training images" in resolved.stdout
