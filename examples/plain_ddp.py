"""A plain DDP script under hpc-train's contract (docs/commands.md, "Plain DDP scripts"), on CPUs (gloo) or GPUs.

    hpc-train submit --cluster local --tasks-per-node 2 -- python examples/plain_ddp.py --steps 300
    hpc-train submit --nodes 2 --tasks-per-node 1 -- python examples/plain_ddp.py

It fits y = 3x - 1 with a DDP linear model: the data are a function of the global step, so a run that is
preempted and resumed gives the same numbers as one that is not. The contract, line by line:

* ``catch_preemption()`` first: hpc-train's signal (USR2) then sets a flag instead of ending the rank;
* ``setup()``: the rank mapping hpc-train exported, the process group, this rank's GPU;
* resume from ``HPC_TRAIN_CHECKPOINT_DIR`` (per run, the same after a requeue) when a checkpoint is there;
* at each step boundary the ranks agree on the flag (one all-reduce); on it rank 0 writes the checkpoint
  atomically (a temporary file, then a rename), every rank waits for it (barrier), and all leave with 75:
  hpc-train requeues the run (at most ``slurm.max_requeues`` times) and this script resumes;
* ``leave(code)`` last: no interpreter finalisation, so a finished rank cannot abort (exit 134) at exit.
"""

from hpc_train.dist import catch_preemption, heartbeat, launch_info, leave, setup, stop_requested

catch_preemption()

import argparse  # noqa: E402 - the handler goes in before anything slow is imported
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def batch_for(step: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of the global step: the same wherever the run was stopped."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.rand(size, 1, generator=generator) * 2 - 1
    return x, 3 * x - 1


def save_atomically(state: dict, path: str) -> None:
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-s", type=float, default=0.1, help="extra time per step (a stand-in for real work)")
    args = parser.parse_args()
    env = setup()
    info = launch_info()
    checkpoint_dir = info["checkpoint_dir"] or "checkpoints"
    os.makedirs(checkpoint_dir, exist_ok=True)
    checkpoint = os.path.join(checkpoint_dir, "plain_ddp.pt")
    model = DDP(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    resumed_from = step
    print(f"rank {env.rank}/{env.world_size}: restart {info['restart']}, starting at step {step}", flush=True)
    while step < args.steps:
        stop = torch.tensor([float(stop_requested())])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            if env.rank == 0:
                save_atomically({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                 "step": step}, checkpoint)
                print(f"checkpointed at step {step}; leaving with {info['exit_requeue']}", flush=True)
            dist.barrier()
            leave(info["exit_requeue"])
        x, y = batch_for(step, env.rank)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step += 1
        heartbeat(step=step)
        time.sleep(args.step_s)
    weight, bias = model.module.weight.item(), model.module.bias.item()
    print(f"rank {env.rank}: done at step {step}: y = {weight:.3f} x {bias:+.3f}", flush=True)
    if env.rank == 0 and info["run_dir"]:
        with open(os.path.join(info["run_dir"], "result.json"), "w") as handle:
            json.dump({"step": step, "resumed_from": resumed_from, "restart": info["restart"],
                       "weight": weight, "bias": bias}, handle)
    dist.barrier()
    return 0


if __name__ == "__main__":
    leave(main())
