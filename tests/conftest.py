"""Shared test setup: the session-wide local Slurm cluster fixture (tests/cluster/fixtures.py), and an
environment free of the machine's site file and of launcher variables, for suites that run the trainer."""

import pytest

pytest_plugins = ["tests.cluster.fixtures"]

LAUNCHER_VARIABLES = ("HPC_TRAIN_RUN_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "SUBMITIT_LOCAL_GLOBALID")


@pytest.fixture
def isolated_launch_env(tmp_path, monkeypatch):
    """No site file from the machine, no run directory or launcher variables from the environment."""
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
