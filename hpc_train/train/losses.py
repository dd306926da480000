"""Long-tail losses, device-agnostic (no ``torch.cuda.FloatTensor``, boolean masks only).

All take raw logits ``(B, C)`` and integer targets ``(B,)`` and return the batch mean. Per-class weights
(class-balanced or DRW) are passed as ``weight`` to ``F.cross_entropy``, which then divides by the summed
weights of the batch's targets, as LDAM-DRW's criterion does; focal divides by the batch size (its
per-sample reduction, LDAM-DRW's ``FocalLoss``).

Balanced softmax and the logit-adjusted loss are implemented separately on purpose: with τ = 1 they are
the same function (log n_c and log π_c differ by log N, which softmax ignores), and a test checks that
two independent implementations agree.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import LossConfig


def class_balanced_weights(counts: Sequence[int] | Tensor, beta: float) -> Tensor:
    """Cui et al. 2019: w_c = (1 - β) / (1 - β^n_c), normalised to sum to C (float64 for the small
    1 - β^n; classes without images get weight 0)."""
    n = torch.as_tensor(counts, dtype=torch.float64)
    effective = 1.0 - torch.pow(torch.full_like(n, beta), n)
    w = torch.where(n > 0, (1.0 - beta) / effective.clamp_min(1e-300), torch.zeros_like(n))
    return w / w.sum() * (n > 0).sum()


def ldam_margins(counts: Sequence[int] | Tensor, max_margin: float) -> Tensor:
    """Cao et al. 2019: m_c ∝ n_c^(-1/4), scaled so the largest (rarest class) is ``max_margin``."""
    n = torch.as_tensor(counts, dtype=torch.float64).clamp_min(1)
    m = 1.0 / torch.sqrt(torch.sqrt(n))
    return m * (max_margin / m.max())


class LongTailLoss(nn.Module):
    """Base: holds the per-class weights, which DRW switches on at ``drw_epoch`` via :meth:`set_epoch`."""

    def __init__(self, counts: Sequence[int], cfg: LossConfig) -> None:
        super().__init__()
        self.counts_list = [int(c) for c in counts]
        self.reweight, self.drw_epoch, self.cb_beta = cfg.reweight, cfg.drw_epoch, cfg.cb_beta
        cb = class_balanced_weights(self.counts_list, cfg.cb_beta)
        self.register_buffer("cb_weights", cb, persistent=False)
        self.weighted = cfg.reweight == "class_balanced"

    def set_epoch(self, epoch: int) -> None:
        """DRW: plain loss before ``drw_epoch``, class-balanced weights from it on."""
        if self.drw_epoch is not None:
            self.weighted = epoch >= self.drw_epoch

    @property
    def weight(self) -> Tensor | None:
        return self.cb_weights if self.weighted else None

    def _prepare(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """Losses are computed in float32 at least (AMP logits arrive in bf16/fp16; float64 stays
        float64); the per-class buffers are kept in float64 and follow the logits' dtype."""
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        weight = self.weight
        return logits, None if weight is None else weight.to(logits.dtype)


class CrossEntropy(LongTailLoss):
    def __init__(self, counts: Sequence[int], cfg: LossConfig) -> None:
        super().__init__(counts, cfg)
        self.label_smoothing = cfg.label_smoothing

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        return F.cross_entropy(logits, target, weight=weight, label_smoothing=self.label_smoothing)


class FocalLoss(LongTailLoss):
    """Lin et al. 2017, per sample: w_y · (1 - p_y)^γ · (-log p_y), averaged over the batch. p_y comes
    from the unweighted softmax (LDAM-DRW derives it from the weighted CE, which mixes the weight into
    the focusing term)."""

    def __init__(self, counts: Sequence[int], cfg: LossConfig) -> None:
        super().__init__(counts, cfg)
        self.gamma = cfg.focal_gamma

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        ce = F.cross_entropy(logits, target, reduction="none")
        focal = (1.0 - torch.exp(-ce)).pow(self.gamma) * ce
        if weight is not None:
            focal = focal * weight[target]
        return focal.mean()


class LDAMLoss(LongTailLoss):
    """Subtract the class margin from the target logit only, scale by s, cross-entropy."""

    def __init__(self, counts: Sequence[int], cfg: LossConfig) -> None:
        super().__init__(counts, cfg)
        self.register_buffer("margins", ldam_margins(self.counts_list, cfg.ldam_max_margin), persistent=False)
        self.scale = cfg.ldam_scale

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        is_target = F.one_hot(target, logits.shape[1]).bool()
        adjusted = torch.where(is_target, logits - self.margins.to(logits.dtype)[None, :], logits)
        return F.cross_entropy(self.scale * adjusted, target, weight=weight)


class BalancedSoftmaxLoss(LongTailLoss):
    """Ren et al. 2020: softmax over logits + log n_c (the training class counts)."""

    def __init__(self, counts: Sequence[int], cfg: LossConfig) -> None:
        super().__init__(counts, cfg)
        n = torch.as_tensor(self.counts_list, dtype=torch.float64).clamp_min(1)
        self.register_buffer("log_counts", torch.log(n), persistent=False)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        return F.cross_entropy(logits + self.log_counts.to(logits.dtype), target, weight=weight)


class LogitAdjustedLoss(LongTailLoss):
    """Menon et al. 2021: softmax over logits + τ·log π_c, π the empirical class prior."""

    def __init__(self, counts: Sequence[int], cfg: LossConfig) -> None:
        super().__init__(counts, cfg)
        total = float(sum(self.counts_list))
        prior = torch.tensor([max(c, 1) / total for c in self.counts_list], dtype=torch.float64)
        self.register_buffer("offsets", cfg.tau * torch.log(prior), persistent=False)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        return F.cross_entropy(logits + self.offsets.to(logits.dtype), target, weight=weight)


LOSSES: dict[str, type[LongTailLoss]] = {
    "ce": CrossEntropy,
    "focal": FocalLoss,
    "ldam": LDAMLoss,
    "balanced_softmax": BalancedSoftmaxLoss,
    "logit_adjusted": LogitAdjustedLoss,
}


def build_loss(cfg: LossConfig, counts: Sequence[int]) -> LongTailLoss:
    return LOSSES[cfg.name](counts, cfg)


def posthoc_adjust(logits: Tensor, counts: Sequence[int], tau: float) -> Tensor:
    """Post-hoc logit adjustment (Menon et al.): predict argmax of logits - τ·log π_c."""
    total = float(sum(counts))
    log_prior = torch.tensor([math.log(max(c, 1) / total) for c in counts], dtype=logits.dtype,
                             device=logits.device)
    return logits - tau * log_prior
