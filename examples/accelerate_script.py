"""An accelerate script under hpc-train's contract (docs/commands.md, "accelerate"), on CPUs (gloo) or GPUs.

    hpc-train submit --cluster local --tasks-per-node 2 -- python examples/accelerate_script.py --steps 200
    hpc-train submit --nodes 2 --tasks-per-node 1 -- python examples/accelerate_script.py

No ``accelerate launch``: hpc-train starts one process per rank and exports the mapping torchrun would
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which accelerate reads as it is
(accelerate 1.15: ``PartialState.__init__``, accelerate/state.py:247-262, takes RANK / WORLD_SIZE / LOCAL_RANK
/ LOCAL_WORLD_SIZE through ``get_cpu_distributed_information``, accelerate/utils/environment.py:263-280, on CPUs;
``torch.distributed.init_process_group`` with env:// reads the same variables on GPUs, state.py:201-242).
It fits y = 3x - 1 with a linear model; the data are a function of the global step, so a run that is preempted
and resumed gives the same numbers as one that is not. The contract, line by line:

* ``catch_preemption()`` first: hpc-train's signal (USR2) then sets a flag instead of ending the rank;
* ``Accelerator(cpu=...)``: on a machine without CUDA ``cpu=True`` is what makes accelerate see the other ranks.
  Without it, ``_prepare_backend`` (state.py:769-817) finds LOCAL_RANK but no GPU, picks no backend and every
  rank trains alone at world size 1 (``DistributedType.NO``);
* resume with ``accelerator.load_state`` from ``HPC_TRAIN_CHECKPOINT_DIR`` (per run, the same after a requeue)
  when a complete state is there; the step counter rides along as a registered object
  (``register_for_checkpointing``, accelerator.py:4115; saved as ``custom_checkpoint_0.pkl``, checkpointing.py:323);
* at each step boundary the ranks agree on the flag with ``set_trigger`` / ``check_trigger``
  (accelerator.py:2863-2913: one all-reduce); on it every rank calls ``save_state`` (accelerator.py:3625: rank 0
  writes the model and optimizer, every rank its RNG state) into a new directory, all wait, rank 0 names it the
  latest with an atomic rename, and all leave with 75: hpc-train requeues the run and this script resumes;
* ``leave(code)`` last: no interpreter finalisation, so a finished rank cannot abort (exit 134) at exit.
"""

from hpc_train.dist import catch_preemption, heartbeat, launch_info, leave, stop_requested

catch_preemption()

import argparse  # noqa: E402 - the handler goes in before anything slow is imported
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

LATEST = "latest"
"""A file in the checkpoint directory naming the newest complete state directory (written last, atomically)."""


class StepCounter:
    """The global step, saved and restored with the accelerator's state (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def batch_for(step: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of the global step: the same wherever the run was stopped."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.rand(size, 1, generator=generator) * 2 - 1
    return x, 3 * x - 1


def latest_state(checkpoint_dir: str) -> str | None:
    """The newest complete state directory, or None: a directory without the ``latest`` pointer to it may be
    half written (the rank was killed while saving) and is never loaded."""
    try:
        with open(os.path.join(checkpoint_dir, LATEST)) as handle:
            return os.path.join(checkpoint_dir, handle.read().strip())
    except FileNotFoundError:
        return None


def checkpoint(accelerator: Accelerator, checkpoint_dir: str, step: int) -> None:
    """Every rank saves into ``state-<step>``; after all are done rank 0 points ``latest`` at it (a rename, so a
    reader sees the old pointer or the new one) and drops the older states."""
    name = f"state-{step}"
    accelerator.save_state(os.path.join(checkpoint_dir, name))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(os.path.join(checkpoint_dir, LATEST + ".tmp"), "w") as handle:
            handle.write(name)
        os.replace(os.path.join(checkpoint_dir, LATEST + ".tmp"), os.path.join(checkpoint_dir, LATEST))
        for old in os.listdir(checkpoint_dir):
            if old.startswith("state-") and old != name:
                shutil.rmtree(os.path.join(checkpoint_dir, old), ignore_errors=True)
    accelerator.wait_for_everyone()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-s", type=float, default=0.1, help="extra time per step (a stand-in for real work)")
    args = parser.parse_args()
    info = launch_info()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, world_size = accelerator.process_index, accelerator.num_processes
    checkpoint_dir = info["checkpoint_dir"] or "checkpoints"
    os.makedirs(checkpoint_dir, exist_ok=True)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Linear(1, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    counter = StepCounter()
    accelerator.register_for_checkpointing(counter)
    resume = latest_state(checkpoint_dir)
    if resume is not None:
        accelerator.load_state(resume)
    resumed_from = counter.step
    print(f"rank {rank}/{world_size}: {accelerator.distributed_type}, restart {info['restart']}, "
          f"starting at step {counter.step}", flush=True)
    while counter.step < args.steps:
        if stop_requested():
            accelerator.set_trigger()
        if accelerator.check_trigger():  # any rank's flag, on every rank (one all-reduce)
            checkpoint(accelerator, checkpoint_dir, counter.step)
            if accelerator.is_main_process:
                print(f"saved state at step {counter.step}; leaving with {info['exit_requeue']}", flush=True)
            leave(info["exit_requeue"])
        x, y = batch_for(counter.step, rank)
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device)))
        optimizer.step()
        counter.step += 1
        heartbeat(step=counter.step)
        time.sleep(args.step_s)
    layer = accelerator.unwrap_model(model)
    weight, bias = layer.weight.item(), layer.bias.item()
    print(f"rank {rank}: done at step {counter.step}: y = {weight:.3f} x {bias:+.3f}", flush=True)
    if accelerator.is_main_process and info["run_dir"]:
        with open(os.path.join(info["run_dir"], "result.json"), "w") as handle:
            json.dump({"step": counter.step, "resumed_from": resumed_from, "restart": info["restart"],
                       "world_size": world_size, "weight": weight, "bias": bias}, handle)
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    leave(main())
