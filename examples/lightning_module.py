"""A Lightning module under hpc-train's contract (docs/commands.md, "Lightning"), on CPUs (gloo) or GPUs.

    hpc-train submit --cluster local --tasks-per-node 2 -- python examples/lightning_module.py --steps 300
    hpc-train submit --nodes 2 --tasks-per-node 1 -- python examples/lightning_module.py

It fits y = 3x - 1 with a linear LightningModule on a fixed synthetic data set (no download). The contract, with
the integration in ``hpc_train.integrations.lightning``:

* ``catch_preemption()`` first, before Lightning is imported: hpc-train's signal (USR2) then sets a flag instead
  of ending the rank;
* ``Trainer(**trainer_options())``: devices, nodes and the DDP strategy from hpc-train's mapping (so
  ``devices="auto"`` on a CPU does not mean one rank training alone), and no Lightning SLURM auto-requeue;
* ``PreemptionCheckpoint()``: on the flag, the Trainer's checkpoint into ``HPC_TRAIN_CHECKPOINT_DIR``, exit 75;
  ``fit(ckpt_path=resume_checkpoint())`` resumes from it after the requeue;
* ``leave(0)`` last: no interpreter finalisation, so a finished rank cannot abort (exit 134) at exit.
"""

from hpc_train.dist import catch_preemption, launch_info, leave

catch_preemption()

import argparse  # noqa: E402 - the handler goes in before anything slow is imported
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hpc_train.integrations.lightning import PreemptionCheckpoint, resume_checkpoint, trainer_options  # noqa: E402

SAMPLES = 4096
BATCH = 32


class LineFit(pl.LightningModule):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.step_s = step_s

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.step_s)  # a stand-in for real work
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_start(self) -> None:
        info = launch_info()
        self.resumed_from = self.trainer.global_step
        print(f"rank {self.global_rank}/{self.trainer.world_size}: restart {info['restart']}, starting at step "
              f"{self.trainer.global_step}, {self.trainer.num_training_batches} batches per epoch", flush=True)


def line_data() -> DataLoader:
    """The same data on every rank and every launch; Lightning's DistributedSampler gives each rank its half."""
    x = torch.rand(SAMPLES, 1, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return DataLoader(TensorDataset(x, 3 * x - 1), batch_size=BATCH)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-s", type=float, default=0.05, help="extra time per step (a stand-in for real work)")
    args = parser.parse_args()
    model = LineFit(args.step_s)
    trainer = pl.Trainer(max_steps=args.steps, callbacks=[PreemptionCheckpoint()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         **trainer_options())
    trainer.fit(model, line_data(), ckpt_path=resume_checkpoint())
    weight, bias = model.layer.weight.item(), model.layer.bias.item()
    print(f"rank {trainer.global_rank}: done at step {trainer.global_step}: y = {weight:.3f} x {bias:+.3f}", flush=True)
    info = launch_info()
    if trainer.is_global_zero and info["run_dir"]:
        with open(os.path.join(str(info["run_dir"]), "result.json"), "w") as handle:
            json.dump({"step": trainer.global_step, "resumed_from": model.resumed_from, "restart": info["restart"],
                       "world_size": trainer.world_size, "batches_per_epoch": trainer.num_training_batches,
                       "weight": weight, "bias": bias}, handle)
    trainer.strategy.barrier("done")
    return 0


if __name__ == "__main__":
    leave(main())
