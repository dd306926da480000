"""Fixtures of the training tests (CPU only; torch is imported by the tests that need it)."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True)
def _isolated_site(tmp_path, monkeypatch):
    """No site file from the machine, no run directory or launcher variables from the environment."""
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    for name in ("HPC_TRAIN_RUN_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "SUBMITIT_LOCAL_GLOBALID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def restore_signals():
    """main() installs USR2/TERM handlers; give the pytest process its own back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    from hpc_train.train import preempt

    preempt.reset()
