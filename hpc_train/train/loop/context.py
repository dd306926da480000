"""Where this rank runs (:class:`RankContext`) and a barrier on its device: what the rank's setup
(:mod:`hpc_train.train.launch`) hands the Trainer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...rank.dist import DistEnv


@dataclass
class RankContext:
    """Where this rank runs: its place in the job and its device."""

    env: DistEnv
    device: torch.device
    rank: int
    world_size: int
    """Ranks that train together (1 for strategy none/dp)."""
    distributed: bool
    """A process group is up (world size > 1)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def barrier(device: torch.device) -> None:
    """A barrier on this rank's device (NCCL otherwise guesses the device and warns)."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
