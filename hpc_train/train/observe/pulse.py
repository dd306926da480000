"""What the Trainer reports about its own progress while it trains (issue 18), in one object so the loop needs
one line at each point: the progress heartbeat (:mod:`hpc_train.rank.heartbeat`) and the ranks' compute times
(:mod:`.stragglers`). Nothing here synchronises ranks beyond one all-gather per epoch, and nothing writes per step.

Where the loop calls it: every ``preempt_check_every_steps`` (where the ranks already agree), at each epoch end
(after the epoch's agreement), before each evaluation, after each checkpoint, and at the end (phase ``done``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...rank import heartbeat
from .stragglers import ComputeTimes


class Pulse:
    """This rank's heartbeat and, with several ranks, its compute times (written by rank 0 to ``run_dir``)."""

    def __init__(self, device: torch.device, group: Any, *, rank: int, world_size: int, hostname: str,
                 distributed: bool, run_dir: Path) -> None:
        self.run_dir, self.writer = run_dir, rank == 0
        self.compute = ComputeTimes(device, group, rank=rank, world_size=world_size,
                                    host=hostname) if distributed else None

    def attach(self, forward: nn.Module) -> None:
        """Time the steps of an eager DDP model (others: captured steps, one rank — not measured)."""
        if self.compute is not None and hasattr(forward, "register_comm_hook"):
            self.compute.attach(forward)

    @staticmethod
    def beat(*, global_step: int, epoch: int, phase: str = "train", force: bool = False) -> None:
        heartbeat.beat(step=global_step, epoch=epoch, phase=phase, force=force)

    def epoch_end(self, *, global_step: int, epoch: int) -> None:
        self.beat(global_step=global_step, epoch=epoch)
        if self.compute is not None:
            self.compute.end_epoch(self.run_dir, epoch=epoch, global_step=global_step, writer=self.writer)
