"""What the Trainer reports about its own progress while it trains (issue 18), in one object so the loop needs
one line at each point: the progress heartbeat (:mod:`hpc_train.rank.heartbeat`) and the ranks' compute times
(:mod:`.stragglers`). Nothing here synchronises ranks beyond one all-gather per epoch, and nothing writes per step.

Where the loop calls it: every ``preempt_check_every_steps`` (where the ranks already agree), at each epoch end
(after the epoch's agreement), before each evaluation, after each checkpoint, and at the end (phase ``done``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...rank import heartbeat
from .stragglers import ComputeTimes


class Pulse:
    def __init__(self, ctx: Any, group: Any) -> None:
        self.compute = ComputeTimes(ctx.device, group, rank=ctx.rank, world_size=ctx.world_size,
                                    host=ctx.env.hostname) if ctx.distributed else None

    def attach(self, forward: nn.Module) -> None:
        """Time the steps of an eager DDP model (others: captured steps, one rank — not measured)."""
        if self.compute is not None and hasattr(forward, "register_comm_hook"):
            self.compute.attach(forward)

    @staticmethod
    def beat(trainer: Any, phase: str = "train", force: bool = False) -> None:
        heartbeat.beat(step=trainer.global_step, epoch=trainer.epoch, phase=phase, force=force)

    def epoch_end(self, trainer: Any) -> None:
        self.beat(trainer)
        if self.compute is not None:
            self.compute.end_epoch(trainer.run_dir, epoch=trainer.epoch, global_step=trainer.global_step,
                                   writer=trainer.ctx.is_main)
