"""Lightning under hpc-train: the rank mapping, hpc-train's preemption contract, and nothing of Lightning's own
SLURM requeue (docs/commands.md, "Lightning"). ::

    from hpc_train.dist import catch_preemption, leave
    catch_preemption()                               # first: USR2 sets a flag instead of ending the rank
    from hpc_train.integrations.lightning import PreemptionCheckpoint, resume_checkpoint, trainer_options
    trainer = L.Trainer(max_steps=..., callbacks=[PreemptionCheckpoint()], **trainer_options())
    trainer.fit(model, data, ckpt_path=resume_checkpoint())
    leave(0)

Why each piece (read against lightning 2.6.6, the release the ``clients`` extra installs):

* Left to itself, Lightning picks ``SLURMEnvironment`` whenever srun started the process
  (``lightning/pytorch/trainer/connectors/accelerator_connector.py:386-398``, ``_choose_and_init_cluster_environment``)
  and then the signal connector installs its SIGUSR1 handler that saves ``hpc_ckpt_*.ckpt`` and runs
  ``scontrol requeue`` itself (``lightning/pytorch/trainer/connectors/signal_connector.py:52-63`` and ``:70-106``):
  that requeue bypasses ``slurm.max_requeues`` and the run's state log, and hpc-train's USR2 still ends the rank.
  :class:`HpcTrainEnvironment` is not a ``SLURMEnvironment``, so the ``isinstance`` test at ``:53`` is false and
  no SIGUSR1 handler is installed: hpc-train owns the requeue.
* Under the local launcher Lightning takes ``LightningEnvironment`` and trusts ``devices``: ``devices="auto"`` on a CPU
  is 1 device (``accelerator_connector.py:368-384``), hence ``SingleDeviceStrategy`` (``:411-419``): rank 0 trains
  alone. :func:`trainer_options` sets ``devices``/``num_nodes``/the DDP strategy from hpc-train's mapping, so the
  world size is the launcher's whatever the script said.
* ``creates_processes_externally`` is True (as ``SLURMEnvironment``'s, ``lightning/fabric/plugins/environments/slurm.py:56-59``):
  hpc-train (srun, the local launcher, torchrun) started every rank, and Lightning's launcher must not start more
  (``lightning/pytorch/strategies/launchers/subprocess_script.py:99-101``). The world size, ranks and rendezvous come
  from :meth:`hpc_train.dist.DistEnv.from_environ`, the mapping every hpc-train rank reads: under torchrun on Slurm
  a worker's ``SLURM_PROCID``/``SLURM_NTASKS`` are not what ``SLURMEnvironment.world_size()`` would take them for
  (``slurm.py:133-135``).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy

from ..dist import DistEnv, DistError, heartbeat, launch_info, leave, stop_requested

CHECKPOINT_NAME = "lightning.ckpt"
"""The file :class:`PreemptionCheckpoint` writes in ``HPC_TRAIN_CHECKPOINT_DIR`` and :func:`resume_checkpoint` finds."""


class HpcTrainEnvironment(ClusterEnvironment):
    """Lightning's view of the job, read from hpc-train's rank mapping (a frozen snapshot taken when it is made)."""

    def __init__(self, dist: DistEnv | None = None) -> None:
        super().__init__()
        self.dist = DistEnv.from_environ() if dist is None else dist

    @property
    def creates_processes_externally(self) -> bool:
        return True  # every rank is hpc-train's; see the module docstring

    @property
    def main_address(self) -> str:
        return self.dist.master_addr

    @property
    def main_port(self) -> int:
        return self.dist.master_port

    @staticmethod
    def detect() -> bool:
        """Whether hpc-train launched this process (its run directory is set). Lightning never calls this for a
        plugin it was given; it is here because the interface asks for it."""
        return bool(os.environ.get("HPC_TRAIN_RUN_DIR"))

    def world_size(self) -> int:
        return self.dist.world_size

    def set_world_size(self, size: int) -> None:
        pass  # the launcher's, not Lightning's, to set (as TorchElasticEnvironment.set_world_size ignores it)

    def global_rank(self) -> int:
        return self.dist.rank

    def set_global_rank(self, rank: int) -> None:
        pass  # likewise

    def local_rank(self) -> int:
        return self.dist.local_rank

    def node_rank(self) -> int:
        return self.dist.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Called by Lightning's launcher before anything starts (``subprocess_script.py:99``): a Trainer whose
        ``devices`` x ``num_nodes`` is not the launcher's world size would hang in the rendezvous or train apart."""
        if num_devices * num_nodes != self.dist.world_size:
            raise DistError(f"Trainer(devices={num_devices}, num_nodes={num_nodes}) is {num_devices * num_nodes} "
                            f"rank(s) but hpc-train started {self.dist.world_size}; pass **trainer_options() "
                            "(hpc_train.integrations.lightning) instead of devices/num_nodes")


def _parallel_devices(dist: DistEnv) -> tuple[str, list[torch.device]]:
    """The accelerator and one device per rank on this node, indexed by local rank as Lightning's DDP does. With
    one GPU visible per task (per-task binding), every rank's device is ``cuda:0``, as :meth:`DistEnv.cuda_device_index`
    says for hpc-train's own ranks."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        count = torch.cuda.device_count()
        index = dist.cuda_device_index(count)  # refuses a local rank beyond the visible GPUs, with what to change
        devices = [torch.device("cuda", index if count == 1 else i) for i in range(dist.local_world_size)]
        return "gpu", devices
    return "cpu", [torch.device("cpu")] * dist.local_world_size


def trainer_options(*, backend: str | None = None, timeout_s: int = 600) -> dict[str, Any]:
    """``pl.Trainer(**trainer_options(), ...)``: ``accelerator``, ``devices``, ``num_nodes`` and ``strategy`` (DDP
    with :class:`HpcTrainEnvironment`; ``gloo`` on CPUs, ``nccl`` on GPUs unless ``backend`` says) from hpc-train's
    mapping, so Lightning's world size is the launcher's whatever ``devices`` the script would have passed; and
    ``default_root_dir``, the run directory (``HPC_TRAIN_RUN_DIR``): Lightning's own files (``lightning_logs/``, its
    checkpoints) are then in the run directory whatever the job's ``workdir`` (under ``workdir: submit`` the working
    directory is the submit directory every run shares). That matters beyond tidiness:
    under srun a ``fit(ckpt_path=None)`` resumes from any ``hpc_ckpt_*.ckpt`` in ``default_root_dir``
    (``lightning/pytorch/trainer/connectors/checkpoint_connector.py:121-122``), another run's included."""
    dist = DistEnv.from_environ()
    accelerator, devices = _parallel_devices(dist)
    environment = HpcTrainEnvironment(dist)
    run_dir = launch_info()["run_dir"]
    common: dict[str, Any] = {"accelerator": accelerator, "num_nodes": dist.num_nodes, "plugins": [environment]}
    if run_dir:
        common["default_root_dir"] = str(run_dir)
    if not dist.is_distributed:
        return {**common, "devices": 1}
    strategy = DDPStrategy(parallel_devices=devices,
                           process_group_backend=backend or ("nccl" if accelerator == "gpu" else "gloo"),
                           timeout=datetime.timedelta(seconds=timeout_s))
    # The environment as a plugin only (Lightning refuses it in both places, accelerator_connector.py:286-290): the
    # connector then skips its own detection (:387-388) and hands the plugin to the strategy (:517-520).
    return {**common, "devices": dist.local_world_size, "strategy": strategy}


def checkpoint_path() -> str:
    """Where the preemption checkpoint goes: ``HPC_TRAIN_CHECKPOINT_DIR`` (per run, the same after a requeue)."""
    directory = launch_info()["checkpoint_dir"]
    if not directory:
        raise DistError("HPC_TRAIN_CHECKPOINT_DIR is not set: run the script with hpc-train submit -- ...")
    return os.path.join(str(directory), CHECKPOINT_NAME)


def resume_checkpoint() -> str | None:
    """``trainer.fit(..., ckpt_path=resume_checkpoint())``: the preemption checkpoint of this run when one was
    written (a requeued launch), else None (a fresh start, or a script run outside hpc-train)."""
    if not launch_info()["checkpoint_dir"]:
        return None
    path = checkpoint_path()
    return path if os.path.exists(path) else None


class PreemptionCheckpoint(pl.Callback):
    """hpc-train's preemption contract as a callback: after every ``check_every_n_steps`` training batches the
    ranks agree on :func:`hpc_train.dist.stop_requested` (one all-reduce); on it the Trainer's checkpoint is written
    to :func:`checkpoint_path` (by rank 0, atomically: a temporary file, then a rename) and every rank leaves with
    ``HPC_TRAIN_EXIT_REQUEUE`` (75) through :func:`hpc_train.dist.leave`: hpc-train requeues the run (at most
    ``slurm.max_requeues`` times) and the next launch resumes from :func:`resume_checkpoint`. Each batch also
    refreshes the rank's progress heartbeat (``status``, the hang watchdog).

    The script must call :func:`hpc_train.dist.catch_preemption` first, before Lightning is imported: until then
    the signal ends the rank."""

    def __init__(self, check_every_n_steps: int = 1) -> None:
        self.check_every_n_steps = check_every_n_steps

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        heartbeat(step=trainer.global_step, epoch=trainer.current_epoch)
        if trainer.global_step % self.check_every_n_steps:
            return
        if trainer.strategy.reduce_boolean_decision(stop_requested(), all=False):
            self.checkpoint_and_leave(trainer)

    def checkpoint_and_leave(self, trainer: pl.Trainer) -> None:
        path = checkpoint_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        trainer.save_checkpoint(path + ".tmp")  # every rank calls it; the strategy writes on rank 0
        trainer.strategy.barrier("hpc_train_checkpoint_written")
        code = int(launch_info()["exit_requeue"])
        if trainer.is_global_zero:
            os.replace(path + ".tmp", path)
            print(f"hpc-train: checkpointed at step {trainer.global_step} to {path}; leaving with {code}", flush=True)
        trainer.strategy.barrier("hpc_train_checkpoint_renamed")
        leave(code)
