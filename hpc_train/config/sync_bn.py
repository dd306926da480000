"""Whether BatchNorm is synchronised across ranks: ``train.sync_bn`` (auto, true, false) and the world
size decide. Torch-free, so ``render`` and ``--dry-run`` show the very decision the ranks make.

``auto`` synchronises when more than one rank trains and a rank's batch is below
:data:`AUTO_BELOW_IMAGES`. 32 images per device is what the standard BatchNorm recipes were tuned with
(ResNet on ImageNet: 256 over 8 GPUs; Goyal et al. 2017 keep 32 per worker at every scale); below it each
rank normalises with statistics of fewer images than those recipes assumed, and the all-reduce per
BatchNorm layer costs little next to such a small per-device step; it uses the fused ``nn.SyncBatchNorm``
on CUDA.

``true`` synchronises at every world size > 1. On CPU ranks it also promises one arithmetic at every world
size, one rank included (``exact``): every rank (a single process too) normalises with
:class:`hpc_train.train.model.batchnorm.GlobalBatchNorm`. Another kernel at world size 1 (PyTorch's own) rounds
differently, and a rounding difference of 1e-7 that flips one max-pool argmax is amplified by re-weighted
training to 1e-2 within an epoch. On CUDA speed comes first (:meth:`SyncBnDecision.kernel`): the fused
``nn.SyncBatchNorm`` at world size > 1 and PyTorch's BatchNorm in one process, the same statistics with other
rounding.
``false`` never synchronises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .training import TrainConfig

AUTO_BELOW_IMAGES = 32
BatchNormKernel = Literal["batchnorm", "fused", "global"]


@dataclass(frozen=True)
class SyncBnDecision:
    on: bool
    reason: str
    exact: bool = False
    """On CPU ranks, the one BatchNorm arithmetic at every world size, one rank included (``sync_bn: true``)."""

    def kernel(self, world_size: int, device_type: str) -> BatchNormKernel:
        """The BatchNorm the ranks run: PyTorch's own (``batchnorm``), CUDA's fused ``nn.SyncBatchNorm``
        (``fused``) or hpc-train's GlobalBatchNorm (``global``). CUDA synchronises with the fused kernel at
        world size > 1 and keeps PyTorch's BatchNorm in one process, ``exact`` or not (no unfused kernel on
        the GPU without a benchmark that pays for it); CPU ranks have no fused kernel and run GlobalBatchNorm
        where synchronised, in one process too when ``exact``."""
        if not self.on:
            return "batchnorm"
        if device_type == "cuda":
            return "fused" if world_size > 1 else "batchnorm"
        return "global" if world_size > 1 or self.exact else "batchnorm"

    def describe(self) -> str:
        what = "synchronised across ranks" if self.on else "per rank"
        if self.exact:
            what += ", on CPUs the same arithmetic at every world size"
        return f"{what} ({self.reason})"


def decide(train: "TrainConfig", world_size: int) -> SyncBnDecision:
    """The decision for the ``train:`` section over ``world_size`` ranks (every caller asks this one)."""
    return rule(train.sync_bn, world_size=world_size, batch_size=train.batch_size, strategy=train.strategy)


def rule(setting: str | bool, *, world_size: int, batch_size: int, strategy: str = "ddp") -> SyncBnDecision:
    """The decision for ``train.sync_bn = setting`` with ``batch_size`` (global) over ``world_size`` ranks."""
    if strategy != "ddp":
        return SyncBnDecision(False, f"strategy {strategy} runs one process")
    per_rank = batch_size // max(1, world_size)
    if setting is True:
        return SyncBnDecision(True, f"sync_bn: true, {per_rank} images per rank", exact=True)
    if world_size <= 1:
        return SyncBnDecision(False, "one rank: its batch is the global batch")
    if setting is False:
        return SyncBnDecision(False, f"sync_bn: false, {per_rank} images per rank")
    if per_rank < AUTO_BELOW_IMAGES:
        return SyncBnDecision(True, f"sync_bn: auto, {per_rank} images per rank < {AUTO_BELOW_IMAGES}")
    return SyncBnDecision(False, f"sync_bn: auto, {per_rank} images per rank >= {AUTO_BELOW_IMAGES}")
