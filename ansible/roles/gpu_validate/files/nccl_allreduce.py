"""Two (or more) processes on one node all-reduce a tensor over NCCL and check the sum.

Started by torchrun (``python -m torch.distributed.run --standalone --nproc-per-node=2``), which sets
RANK, LOCAL_RANK and WORLD_SIZE. ``--backend gloo`` runs the same check on CPUs (for testing the script).
Exit 0 and one line "all-reduce ok ..." from rank 0 when every rank saw the right sum.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--numel", type=int, default=64 * 1024 * 1024, help="elements per rank (256 MiB of float32)")
    args = parser.parse_args(argv)

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
    rank, world_size = dist.get_rank(), dist.get_world_size()

    # Rank r contributes r + 1 everywhere, so every element of the sum is world_size * (world_size + 1) / 2.
    tensor = torch.full((args.numel,), float(rank + 1), device=device)
    dist.all_reduce(tensor)
    expected = world_size * (world_size + 1) / 2
    ok = bool(torch.all(tensor == expected).item())
    flags = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()

    if rank == 0:
        verdict = "ok" if flags.item() == 1 else "WRONG SUM"
        print(f"all-reduce {verdict}: backend={args.backend} world_size={world_size} numel={args.numel}")
    return 0 if flags.item() == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
