"""Whether BatchNorm is synchronised across ranks: ``train.sync_bn`` (auto, true, false) and the world
size decide. Torch-free, so ``render`` and ``--dry-run`` show the very decision the ranks make.

``auto`` synchronises when more than one rank trains and a rank's batch is below
:data:`AUTO_BELOW_IMAGES`. 32 images per device is what the standard BatchNorm recipes were tuned with
(ResNet on ImageNet: 256 over 8 GPUs; Goyal et al. 2017 keep 32 per worker at every scale); below it each
rank normalises with statistics of fewer images than those recipes assumed, and the all-reduce per
BatchNorm layer costs little next to such a small per-device step. Identical weights at every world size
need it on at every world size > 1 (``sync_bn: true``); above the threshold ``auto`` trades that for
the collectives it saves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .training import TrainConfig

AUTO_BELOW_IMAGES = 32


@dataclass(frozen=True)
class SyncBnDecision:
    on: bool
    reason: str

    def describe(self) -> str:
        return ("synchronised across ranks" if self.on else "per rank") + f" ({self.reason})"


def decide(train: "TrainConfig", world_size: int) -> SyncBnDecision:
    """The decision for the ``train:`` section over ``world_size`` ranks (every caller asks this one)."""
    return rule(train.sync_bn, world_size=world_size, batch_size=train.batch_size, strategy=train.strategy)


def rule(setting: str | bool, *, world_size: int, batch_size: int, strategy: str = "ddp") -> SyncBnDecision:
    """The decision for ``train.sync_bn = setting`` with ``batch_size`` (global) over ``world_size`` ranks."""
    if strategy != "ddp":
        return SyncBnDecision(False, f"strategy {strategy} runs one process")
    if world_size <= 1:
        return SyncBnDecision(False, "one rank: its batch is the global batch")
    per_rank = batch_size // world_size
    if setting is True:
        return SyncBnDecision(True, f"sync_bn: true, {per_rank} images per rank")
    if setting is False:
        return SyncBnDecision(False, f"sync_bn: false, {per_rank} images per rank")
    if per_rank < AUTO_BELOW_IMAGES:
        return SyncBnDecision(True, f"sync_bn: auto, {per_rank} images per rank < {AUTO_BELOW_IMAGES}")
    return SyncBnDecision(False, f"sync_bn: auto, {per_rank} images per rank >= {AUTO_BELOW_IMAGES}")
