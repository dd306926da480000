"""Decoupling (Kang et al. 2020) as classifier-balancing runs it: the stage-1 snapshot τ-normalisation uses.

τ-normalisation rescales the classifier of the *jointly trained* (stage-1) model — classifier-balancing's
``tau_norm.py`` loads the stage-1 checkpoint's ``fc.weight`` and that model's features — not the
classifier cRT re-trains. cRT keeps the backbone in training mode, so it re-estimates the BatchNorm
statistics on class-balanced batches; the snapshot therefore holds the stage-1 classifier *and* the
stage-1 BatchNorm buffers, and τ-normalisation evaluates with both put back.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from .models import LongTailNet

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
