"""hpc_train.integrations.lightning read against Lightning itself (issue 27): what Lightning's own environments make
of the same process, and what the integration makes of it. In-process, no ranks started (the ranks are in
tests/examples/test_examples_local.py and tests/real_cluster/test_examples.py)."""

from __future__ import annotations

import signal

import pytest
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy

from hpc_train.dist import DistError
from hpc_train.integrations.lightning import HpcTrainEnvironment, trainer_options

# Rank 3 of 4 (2 nodes x 2), a torchrun worker in a Slurm step: the step has one task per node, so Slurm's own
# variables say task 1 of 2, which is what Lightning's SLURMEnvironment reads as the rank and world size.
TORCHRUN_IN_A_SLURM_STEP = {
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "MASTER_ADDR": "node1", "MASTER_PORT": "29555", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "train",
    "HPC_TRAIN_RUN_DIR": "/runs/lit/77",
}


@pytest.fixture
def torchrun_in_slurm(monkeypatch):
    for name, value in TORCHRUN_IN_A_SLURM_STEP.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU ranks, whatever the machine has


def test_the_environment_is_the_launchers_rank_not_the_steps_task(torchrun_in_slurm):
    slurm = SLURMEnvironment(auto_requeue=False)
    assert (slurm.global_rank(), slurm.world_size()) == (1, 2)  # what Lightning alone would take
    ours = HpcTrainEnvironment()
    assert (ours.global_rank(), ours.local_rank(), ours.node_rank(), ours.world_size()) == (3, 1, 1, 4)
    assert (ours.main_address, ours.main_port, ours.creates_processes_externally) == ("node1", 29555, True)
    assert not isinstance(ours, SLURMEnvironment)  # signal_connector.py:53: no SIGUSR1 scontrol-requeue handler


def test_trainer_options_make_the_world_whatever_devices_said(torchrun_in_slurm):
    options = trainer_options()
    assert (options["accelerator"], options["devices"], options["num_nodes"]) == ("cpu", 2, 2)
    assert isinstance(options["strategy"], DDPStrategy) and options["default_root_dir"] == "/runs/lit/77"
    (environment,) = options["plugins"]
    assert environment.world_size() == 4
    with pytest.raises(DistError, match=r"devices=1, num_nodes=1\) is 1 rank\(s\) but hpc-train started 4"):
        environment.validate_settings(num_devices=1, num_nodes=1)  # devices="auto" on a CPU, without the options


def test_a_trainer_built_from_the_options_installs_no_requeue_handler(torchrun_in_slurm):
    # The Trainer's signal connector is what Lightning runs at fit() start; SIGUSR1 stays as it was.
    import lightning.pytorch as pl

    before = signal.getsignal(signal.SIGUSR1)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, **trainer_options())
    assert trainer.world_size == 4 and trainer.global_rank == 3 and trainer.num_nodes == 2
    trainer._signal_connector.register_signal_handlers()
    try:
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        trainer._signal_connector.teardown()


def test_resume_checkpoint_is_this_runs_checkpoint_or_none(tmp_path, monkeypatch):
    from hpc_train.integrations.lightning import CHECKPOINT_NAME, resume_checkpoint

    monkeypatch.delenv("HPC_TRAIN_CHECKPOINT_DIR", raising=False)
    assert resume_checkpoint() is None  # a script run outside hpc-train starts fresh
    monkeypatch.setenv("HPC_TRAIN_CHECKPOINT_DIR", str(tmp_path))
    (tmp_path.parent / CHECKPOINT_NAME).write_text("")  # another directory's file is not this run's
    assert resume_checkpoint() is None
    (tmp_path / CHECKPOINT_NAME).write_text("")
    assert resume_checkpoint() == str(tmp_path / CHECKPOINT_NAME)
