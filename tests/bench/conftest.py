"""The benchmark references are honest: fed what ours is fed, they compute what ours computes.

CPU, tiny sizes, one thread; torch is imported by the tests themselves.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    for name in ("HPC_TRAIN_RUN_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "SUBMITIT_LOCAL_GLOBALID"):
        monkeypatch.delenv(name, raising=False)
