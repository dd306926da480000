"""A plug-in loss (``tests.scripts.blocking_loss:build``) that blocks forever on one rank at its K-th training call:
a rank stuck in user code while the others wait for it in the gradient all-reduce (the watchdog tests)."""

from __future__ import annotations

import os
import threading

import torch.nn.functional as F


def build(counts, block_at_call: int = 30, block_rank: int = 1, first_launch_only: bool = False):
    from hpc_train.runs.rundir import instance_of

    calls = [0]
    blocks = not (first_launch_only and instance_of()[1] > 0)  # a relaunch (requeue) runs through

    def blocking_loss(logits, target):
        calls[0] += 1
        if blocks and calls[0] == block_at_call and int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0) == block_rank:
            threading.Event().wait()  # never set: this rank stops here
        return F.cross_entropy(logits, target, reduction="none")

    return blocking_loss
