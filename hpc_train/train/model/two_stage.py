"""Decoupling (Kang et al. 2020) as classifier-balancing runs it: the stage-1 snapshot τ-normalisation uses.

τ-normalisation rescales the classifier of the *jointly trained* (stage-1) model — classifier-balancing's
``tau_norm.py`` loads the stage-1 checkpoint's ``fc.weight`` and that model's features — not the
classifier cRT re-trains. cRT keeps the backbone in training mode, so it re-estimates the BatchNorm
statistics on class-balanced batches; the snapshot therefore holds the stage-1 classifier *and* the
stage-1 BatchNorm buffers, and τ-normalisation evaluates with both put back.

Stage 1 is the best epoch on the held-out split when there is one — classifier-balancing's stage 2 loads
stage 1's best checkpoint on val — else the end of stage 1; never an epoch chosen on test. Stage 2 (cRT and
its relatives) re-initialises the classifier (cRT: a new ``nn.Linear``) or fine-tunes it (MiSLAS, weight
balancing), on frozen features. Weight balancing's MaxNorm (:class:`MaxNorm`) caps the class vectors' norms
after every stage-2 epoch.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from torch import nn

from .models import LongTailNet, make_classifier

TAU_GRID = tuple(round(0.1 * i, 1) for i in range(21))
"""τ values tried by τ-normalisation (classifier-balancing's np.linspace(0, 2, 21))."""


def snapshot(model: LongTailNet) -> dict[str, Any]:
    """The stage-1 classifier and backbone buffers (copies; they go into checkpoints as tensors)."""
    return {"classifier": {k: v.detach().clone() for k, v in model.classifier.state_dict().items()},
            "backbone_buffers": {k: v.detach().clone() for k, v in model.backbone.named_buffers()}}


@contextlib.contextmanager
def backbone_buffers(model: LongTailNet, buffers: dict[str, Tensor]) -> Iterator[None]:
    """Evaluate with ``buffers`` (the stage-1 BatchNorm statistics) in the backbone, then put the
    current ones back."""
    current = dict(model.backbone.named_buffers())
    saved = {k: v.detach().clone() for k, v in current.items()}
    with torch.no_grad():
        for k, v in buffers.items():
            current[k].copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in saved.items():
                current[k].copy_(v)


def tau_heads(classifier_state: dict[str, Tensor],
              device: torch.device) -> dict[str, Callable[[Tensor], Tensor]] | None:
    """One head per τ in :data:`TAU_GRID`: features @ (w_c / ||w_c||^τ)ᵀ, the bias dropped as in
    classifier-balancing's tau_norm. None when the classifier is not linear (no weight and bias)."""
    if "bias" not in classifier_state:
        return None
    weight = classifier_state["weight"].detach().float().to(device)
    norms = weight.norm(dim=1, keepdim=True)

    def head(tau: float) -> Callable[[Tensor], Tensor]:
        scaled = weight / norms.pow(tau)
        return lambda f: f.float() @ scaled.t()

    return {str(tau): head(tau) for tau in TAU_GRID}


def begin_stage_two(model: LongTailNet, *, reinit: bool, num_classes: int, device: torch.device,
                    stage1_weights: dict[str, Tensor] | None = None, loss_name: str = "ce") -> dict[str, Any]:
    """Put stage 1's weights in place (``stage1_weights``: the best on the held-out split; None: the model as
    it is, the end of stage 1), keep its snapshot for τ-normalisation, and re-create the classifier when
    ``reinit`` (PyTorch's default ``nn.Linear`` init, as classifier-balancing's cRT builds it; the caller seeds
    it; with stage 2's loss ``loss_name`` sigmoid_focal its bias starts at -log(C - 1), as stage 1's does).
    Returns the snapshot."""
    if stage1_weights is not None:
        model.load_state_dict(stage1_weights)
    kept = snapshot(model)
    if reinit:
        model.classifier = make_classifier(model.feature_dim, num_classes, model.classifier_kind).to(device)
        if loss_name == "sigmoid_focal" and isinstance(model.classifier, nn.Linear):
            start_at_one_over_c(model.classifier, num_classes)
    return kept


@torch.no_grad()
def start_at_one_over_c(classifier: nn.Linear, num_classes: int) -> None:
    """Cui et al.'s sigmoid losses start every class at p = 1/C: bias -log(C - 1) (``src/model_base.py``)."""
    classifier.bias.fill_(-math.log(max(num_classes - 1, 1)))


def freeze_backbone(model: LongTailNet) -> list[nn.Parameter]:
    """Stage 2 trains the classifier alone: the backbone's weights stop learning; returns what does."""
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    return list(model.classifier.parameters())


class MaxNorm:
    """Weight balancing's MaxNorm by projected gradient descent (ShadeAlsha/LTR-weight-balancing,
    ``utils/regularizers.py``, ``MaxNorm_via_PGD``): the radius is fixed once, when stage 2 starts, at
    min + thresh·(max - min) of the classifier's per-class weight norms (``setPerLayerThresh``); ``project``
    scales every class vector longer than it back onto the ball (``PGD``; the bias has an infinite radius).
    The reference projects once per epoch, after the epoch's training steps (``utils/trainval.py``), and so
    does the trainer. The same on every rank: the weights are."""

    def __init__(self, radius: float) -> None:
        self.radius = radius

    @classmethod
    def start(cls, classifier: nn.Module, thresh: float) -> "MaxNorm":
        norms = classifier.weight.detach().norm(dim=1)  # in the weights' dtype, as the reference computes it
        return cls(float(norms.min() + thresh * (norms.max() - norms.min())))

    @torch.no_grad()
    def project(self, classifier: nn.Module) -> None:
        weight = classifier.weight
        norms = weight.norm(dim=1, keepdim=True)
        weight.mul_(torch.where(norms > self.radius, self.radius / norms, torch.ones_like(norms)))
