"""Long-tail losses, device-agnostic (no ``torch.cuda.FloatTensor``, boolean masks only).

Every loss computes per-sample values from raw logits ``(b, C)`` and integer targets ``(b,)`` — weighted
by the class weight of the target where the loss is weighted — and reduces them over the *global*
batch, whatever share of it this rank holds (:meth:`LongTailLoss.forward`):

    loss_r = W · Σ_{i in rank r} ℓ_i / D,   D = Σ_{i in the global batch} w_{y_i}   (or the global batch size)

DDP averages gradients over the W ranks, so the gradient is that of Σ_all ℓ_i / D, the single-process
loss, at any world size and with uneven shares (the last batch of an epoch). Every rank knows the
global batch's targets (the epoch's sequence is the same on every rank), so D needs no collective. The
class weights are always a tensor (ones before DRW switches them, in place), so the step is the same
code at every epoch. Cross-entropy-type losses divide by the summed weights of the targets, as
``F.cross_entropy(weight=w)`` and LDAM-DRW's criterion do; focal divides by the batch size (its
per-sample reduction, LDAM-DRW's ``FocalLoss``).

The per-class buffers (class weights, margins, offsets) are computed and kept in float64; :meth:`LongTailLoss.
reserve` makes their copies in the step's dtype (float32) once, so a step reads them without casting (three
casts per step before) — the same values, as a float64 → float32 cast at every step gave.

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

from ...config import LossConfig
from ...config.plugins import is_import_path
from ...errors import ConfigError
from ...plugin_loading import call as call_plugin


def target_mask(target: Tensor, num_classes: int) -> Tensor:
    """``(b, C)`` booleans, True at each sample's target class: ``F.one_hot(target, C).bool()`` without
    one_hot's range check, which reads the targets' min and max back to the host on the CPU."""
    return target[:, None] == torch.arange(num_classes, device=target.device)[None, :]


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
    """Base: per-class weights (switched on at ``drw_epoch`` by :meth:`set_epoch`) and the global-batch
    reduction. Subclasses implement :meth:`per_sample`."""

    batch_mean = False
    """A batch mean in its reference (the focal losses): always divided by the batch size."""

    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__()
        self.normalise_by_weight = cfg.normalise == "weight_sum" and not self.batch_mean
        """Divide by the global batch's summed target weights; False: by its size."""
        self.counts_list = [int(c) for c in counts]
        self.num_classes = len(self.counts_list)
        self.world_size = world_size
        self.reweight, self.drw_epoch, self.cb_beta = cfg.reweight, cfg.drw_epoch, cfg.cb_beta
        cb = class_balanced_weights(self.counts_list, cfg.cb_beta)
        self.register_buffer("cb_weights", cb, persistent=False)
        # The weights in use: ones (x * 1.0 is exact, so an unweighted loss is bit for bit the plain one)
        # or the class-balanced ones; DRW copies the latter in at its epoch.
        weighted = cfg.reweight == "class_balanced" and cfg.drw_epoch is None
        self.register_buffer("class_weights", cb.clone() if weighted else torch.ones_like(cb), persistent=False)
        self._zeros = torch.zeros(0)
        self._compute: dict[str, Tensor] = {}
        """The per-class buffers in the step's dtype (:meth:`reserve`), by name: what a step reads."""

    per_class_buffers: tuple[str, ...] = ("class_weights",)
    """The float64 buffers a step reads, each kept in the step's dtype too (:meth:`per_class`)."""

    def set_epoch(self, epoch: int) -> None:
        """DRW: plain loss before ``drw_epoch``, class-balanced weights from it on (in place, the copy in the
        step's dtype too)."""
        if self.drw_epoch is not None:
            self.class_weights.copy_(self.cb_weights if epoch >= self.drw_epoch else torch.ones_like(self.cb_weights))
            if "class_weights" in self._compute:
                self._compute["class_weights"].copy_(self.class_weights)

    def per_class(self, name: str, dtype: torch.dtype) -> Tensor:
        """The per-class buffer ``name`` in ``dtype``: the copy :meth:`reserve` made (no cast in a step), or a cast."""
        kept = self._compute.get(name)
        return kept if kept is not None and kept.dtype == dtype else getattr(self, name).to(dtype)

    def _prepare(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Losses are computed in float32 at least (AMP logits arrive in bf16/fp16; float64 stays
        float64); the per-class buffers are kept in float64 and read in the logits' dtype."""
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return logits, self.per_class("class_weights", logits.dtype)

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        """``(b,)`` loss values, each weighted by its target's class weight where the loss is weighted."""
        raise NotImplementedError

    def reserve(self, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate :meth:`normaliser`'s scratch for global batches up to ``batch`` and the per-class buffers in
        ``dtype`` now: a captured step must not allocate state that outlives it."""
        if self._zeros.shape[0] < batch or self._zeros.dtype != dtype or self._zeros.device != device:
            self._zeros = torch.zeros(batch, self.num_classes, dtype=dtype, device=device)
        self._compute = {name: getattr(self, name).to(device=device, dtype=dtype) for name in self.per_class_buffers}

    def normaliser(self, global_target: Tensor, dtype: torch.dtype) -> Tensor:
        """D: the global batch's summed target weights, or its size. The sum is the second output of
        ``nll_loss`` itself, so a rank holding the whole global batch (world size 1) divides by exactly
        the number ``F.cross_entropy(weight=w)`` divides by: bit for bit the single-process loss."""
        n = global_target.numel()
        if not self.normalise_by_weight:
            return torch.full((), n, dtype=dtype, device=global_target.device)
        if self._zeros.shape[0] < n or self._zeros.dtype != dtype or self._zeros.device != global_target.device:
            self.reserve(n, dtype, global_target.device)
        weight = self.per_class("class_weights", dtype)
        return torch.ops.aten.nll_loss_forward(self._zeros[:n], global_target, weight, 1, -100)[1]

    def terms(self, logits: Tensor, target: Tensor, global_target: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The per-sample values and the factor W / D that makes their sum this rank's share (what ImbSAM splits
        into its head and tail parts)."""
        values = self.per_sample(logits, target)
        total = self.normaliser(target if global_target is None else global_target, values.dtype)
        # 1 / D is exactly W / D at W = 1, in one operation instead of two
        return values, total.reciprocal() if self.world_size == 1 else self.world_size / total

    def forward(self, logits: Tensor, target: Tensor, global_target: Tensor | None = None) -> Tensor:
        """This rank's share of the global batch's loss (see the module docstring). ``global_target``:
        the targets of the whole global batch; None means this rank holds all of it."""
        values, scale = self.terms(logits, target, global_target)
        return values.sum() * scale


class CrossEntropy(LongTailLoss):
    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__(counts, cfg, world_size)
        self.label_smoothing = cfg.label_smoothing

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        return F.cross_entropy(logits, target, weight=weight, label_smoothing=self.label_smoothing, reduction="none")


class _Focusing(LongTailLoss):
    """The focal losses' shared part: the focusing exponent γ (``train.loss.focal_gamma``), averaged over the
    batch (their references divide by the batch size, not by the summed class weights)."""

    batch_mean = True

    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__(counts, cfg, world_size)
        self.gamma = cfg.focal_gamma


class FocalLoss(_Focusing):
    """Lin et al. 2017, per sample: w_y · (1 - p_y)^γ · (-log p_y), averaged over the batch. p_y comes
    from the unweighted softmax (LDAM-DRW derives it from the weighted CE, which mixes the weight into
    the focusing term)."""

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        ce = F.cross_entropy(logits, target, reduction="none")
        return (1.0 - torch.exp(-ce)).pow(self.gamma) * ce * weight[target]


class SigmoidFocalLoss(_Focusing):
    """Cui et al. 2019 (richardaecn/class-balanced-loss ``src/cifar_main.py``, ``focal_loss``): per class a
    sigmoid binary cross-entropy against the one-hot target, times the focusing term (1 - p_t)^γ written as
    exp(-γ·t·z - γ·log(1 + e^-z)) (t the one-hot label, z the logit; softplus keeps it finite for large |z|),
    summed over the classes, weighted by the class weight of the sample's target, divided by the number of
    labels — the batch size. γ = 0 is their sigmoid loss; with ``reweight: class_balanced`` their CB focal
    loss. (Their last layer starts with bias -log(C - 1): :func:`~.models.init_model`.)"""

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        onehot = target_mask(target, logits.shape[1]).to(logits.dtype)
        bce = F.binary_cross_entropy_with_logits(logits, onehot, reduction="none")
        if self.gamma:
            bce = torch.exp(-self.gamma * (onehot * logits + F.softplus(-logits))) * bce
        return bce.sum(dim=1) * weight[target]


class SoftmaxBCELoss(LongTailLoss):
    """Weight balancing's stage-2 "CB loss" (ShadeAlsha/LTR-weight-balancing ``utils/class_balanced_loss.py``,
    vandit15's port, ``loss_type="softmax"``): binary cross-entropy of the softmax probabilities against the
    one-hot target, weighted by the class weight of the sample's target, averaged over batch x classes (so each
    sample's classes are averaged here and the base divides by the batch size). The logs are clamped at -100,
    as ``F.binary_cross_entropy`` clamps them; log(1 - p_c) is taken from the logits, finite where p_c rounds
    to 1. With ``reweight: class_balanced`` it is their ``CB_loss(..., "softmax", β, γ)``."""

    batch_mean = True

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        is_target = target_mask(target, logits.shape[1])
        log_p = F.log_softmax(logits, dim=1)
        return -(torch.where(is_target, log_p, log_one_minus_softmax(logits, log_p))
                 .clamp_min(-100.0).mean(dim=1)) * weight[target]


def log_one_minus_softmax(logits: Tensor, log_p: Tensor) -> Tensor:
    """log(1 - p_c) for every class, stable: log1p(-p_c) where p_c <= 1/2, and for the one class per row that
    may exceed 1/2 (the argmax) the log-sum-exp of the other logits minus that of all of them."""
    top = logits.argmax(dim=1, keepdim=True)
    others = logits.scatter(1, top, float("-inf"))
    log_rest = (torch.logsumexp(others, dim=1, keepdim=True) - torch.logsumexp(logits, dim=1, keepdim=True))
    small = torch.log1p(-log_p.exp().clamp_max(0.5))
    return small.scatter(1, top, log_rest)


def label_aware_smoothing(counts: Sequence[int], smooth_head: float, smooth_tail: float) -> Tensor:
    """MiSLAS's per-class smoothing (``methods.py``, ``LabelAwareSmoothing``, shape ``concave``): ε_c = tail +
    (head - tail)·sin((n_c - n_min)·π / (2·(n_max - n_min))); every class gets ``smooth_head`` when all counts
    are equal (where MiSLAS divides by zero)."""
    n = torch.as_tensor(counts, dtype=torch.float64)
    spread = float(n.max() - n.min())
    if spread == 0:
        return torch.full_like(n, smooth_head)
    return smooth_tail + (smooth_head - smooth_tail) * torch.sin((n - n.min()) * math.pi / (2 * spread))


class LabelAwareSmoothingLoss(LongTailLoss):
    """Zhong et al. 2021 (MiSLAS): (1 - ε_y)·(-log p_y) + ε_y·mean_c(-log p_c), ε_y from the target's class
    (:func:`label_aware_smoothing`); MiSLAS takes the batch mean (the ``weight_sum`` normaliser without class
    weights)."""

    per_class_buffers = ("class_weights", "smoothing")

    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__(counts, cfg, world_size)
        self.register_buffer("smoothing", label_aware_smoothing(self.counts_list, cfg.smooth_head, cfg.smooth_tail),
                             persistent=False)

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        log_p = F.log_softmax(logits, dim=1)
        eps = self.per_class("smoothing", logits.dtype)[target]
        nll = -log_p.gather(1, target[:, None]).squeeze(1)
        return ((1.0 - eps) * nll + eps * -log_p.mean(dim=1)) * weight[target]


class LDAMLoss(LongTailLoss):
    """Subtract the class margin from the target logit only, scale by s, cross-entropy. The margin is added,
    negated, to each row's target logit (``scatter_add``): bit for bit LDAM-DRW's ``torch.where(index, x - m,
    x)`` (x + (-m) is x - m in IEEE arithmetic), and its backward passes the gradient through unchanged (the
    ``where`` took five operations)."""

    per_class_buffers = ("class_weights", "negative_margins")

    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__(counts, cfg, world_size)
        self.register_buffer("margins", ldam_margins(self.counts_list, cfg.ldam_max_margin), persistent=False)
        self.register_buffer("negative_margins", -self.margins, persistent=False)
        self.scale = cfg.ldam_scale

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        shift = self.per_class("negative_margins", logits.dtype)[target]
        adjusted = logits.scatter_add(1, target[:, None], shift[:, None])
        return F.cross_entropy(self.scale * adjusted, target, weight=weight, reduction="none")


class BalancedSoftmaxLoss(LongTailLoss):
    """Ren et al. 2020: softmax over logits + log n_c (the training class counts)."""

    per_class_buffers = ("class_weights", "log_counts")

    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__(counts, cfg, world_size)
        n = torch.as_tensor(self.counts_list, dtype=torch.float64).clamp_min(1)
        self.register_buffer("log_counts", torch.log(n), persistent=False)

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        return F.cross_entropy(logits + self.per_class("log_counts", logits.dtype), target, weight=weight,
                               reduction="none")


class LogitAdjustedLoss(LongTailLoss):
    """Menon et al. 2021: softmax over logits + τ·log π_c, π the empirical class prior."""

    per_class_buffers = ("class_weights", "offsets")

    def __init__(self, counts: Sequence[int], cfg: LossConfig, world_size: int = 1) -> None:
        super().__init__(counts, cfg, world_size)
        total = float(sum(self.counts_list))
        prior = torch.tensor([max(c, 1) / total for c in self.counts_list], dtype=torch.float64)
        self.register_buffer("offsets", cfg.tau * torch.log(prior), persistent=False)

    def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
        logits, weight = self._prepare(logits)
        return F.cross_entropy(logits + self.per_class("offsets", logits.dtype), target, weight=weight,
                               reduction="none")


LOSSES: dict[str, type[LongTailLoss]] = {
    "ce": CrossEntropy,
    "focal": FocalLoss,
    "ldam": LDAMLoss,
    "balanced_softmax": BalancedSoftmaxLoss,
    "logit_adjusted": LogitAdjustedLoss,
    "label_aware_smoothing": LabelAwareSmoothingLoss,
    "sigmoid_focal": SigmoidFocalLoss,
    "softmax_bce": SoftmaxBCELoss,
}
"""The built-in losses, by the names ``train.loss.name`` takes (``config.LossName``: a test ties them)."""


def build_plugin_loss(cfg: LossConfig, counts: Sequence[int], world_size: int = 1) -> LongTailLoss:
    """A plug-in loss (docs/training.md, Plug-ins): ``build(counts=[n_0, ...], **args)`` returns ``loss(logits,
    target)`` giving *per-sample* values ``(batch,)``; weighted and normalised over the global batch here, as the
    built-in losses are (:class:`LongTailLoss`), so the plug-in is right at any world size."""
    function = call_plugin(cfg.name, "loss", dict(cfg.args), counts=[int(c) for c in counts])
    if not callable(function):
        raise ConfigError(f"train.loss.name: {cfg.name} returned {type(function).__name__}, not a loss(logits, target)")

    class Plugin(LongTailLoss):
        """The user's per-sample loss, weighted by the class weight of each target (ones unless ``reweight`` or
        DRW) and normalised over the global batch's summed weights (its size when unweighted)."""

        def __init__(self) -> None:
            super().__init__(counts, cfg, world_size)
            self.function = function  # an nn.Module is registered (it follows .to(device))

        def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
            logits, weight = self._prepare(logits)
            values = self.function(logits, target)
            if not isinstance(values, Tensor) or values.shape != target.shape:
                shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
                raise ConfigError(f"train.loss.name: {cfg.name} must return per-sample values of shape "
                                  f"{tuple(target.shape)} (the trainer normalises over the global batch); got {shape}")
            return values.to(logits.dtype) * weight[target]

    return Plugin()


PROBE_BATCH = 4


def probe_plugin_loss(cfg: LossConfig, counts: Sequence[int]) -> str:
    """Build a plug-in loss and call it on a batch of :data:`PROBE_BATCH` random logits, as the trainer does: it
    must give per-sample values of shape ``(batch,)`` (a scalar — a mean over the batch — is refused, exit 2:
    the trainer normalises over the global batch). Returns what it checked, for the dry run's line."""
    loss = build_plugin_loss(cfg, counts)
    classes = len(counts)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(PROBE_BATCH, classes, generator=generator)
    target = torch.arange(PROBE_BATCH) % classes
    try:
        loss.per_sample(logits, target)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is a configuration error
        raise ConfigError(f"train.loss.name: {cfg.name} fails on a batch of {PROBE_BATCH} CPU logits "
                          f"({type(exc).__name__}: {exc})") from None
    return f"called on {PROBE_BATCH} x {classes} logits: per-sample values of shape ({PROBE_BATCH},)"


def build_loss(cfg: LossConfig, counts: Sequence[int], world_size: int = 1) -> LongTailLoss:
    """The loss ``cfg`` names, a built-in one or a plug-in's per-sample loss (:func:`build_plugin_loss`);
    ``world_size``: the ranks whose gradients DDP averages (see the module docstring)."""
    if is_import_path(cfg.name):
        return build_plugin_loss(cfg, counts, world_size)
    return LOSSES[cfg.name](counts, cfg, world_size)


def log_prior(counts: Sequence[int], dtype: torch.dtype = torch.float32,
              device: torch.device | None = None) -> Tensor:
    """log π_c, the empirical class prior of the training counts (a class without images counts as 1)."""
    total = float(sum(counts))
    return torch.tensor([math.log(max(c, 1) / total) for c in counts], dtype=dtype, device=device)


def posthoc_adjust(logits: Tensor, prior: Tensor, tau: float) -> Tensor:
    """Post-hoc logit adjustment (Menon et al.): predict argmax of logits - τ·log π_c (``prior``:
    :func:`log_prior`, made once by the caller: a copy from the host per call would wait for the GPU)."""
    return logits - tau * prior.to(logits.dtype)
