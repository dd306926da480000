"""Sharpness-aware minimisation in the training step: SAM (Foret et al.; Rangwani et al. 2022 on long-tailed
data) and ImbSAM (Zhou et al. 2023), kept apart from the plain step in :mod:`.step`.

SAM, as val-iisc/Saddle-LongTail's ``sam.py`` runs it: the gradient g at the weights w, the ascent step
ε = ρ·g / (‖g‖ + 1e-12) (‖·‖ over every parameter that has a gradient), the gradient at w + ε, then the
weights put back to w exactly and one step of the base optimizer with that second gradient (weight decay
and momentum at w, as its ``second_step`` does). Both passes run the model in training mode, so BatchNorm's
running statistics move twice per step, as in the reference.

ImbSAM, as cool-xuan/Imbalanced_SAM's ``utils/trainval.py`` (``forbackward``) and ``imbsam.py`` run it: the
per-sample losses of one forward pass are split by the target's class into the head part (classes with at
least ``sam_tail_below`` training images) and the tail part (times ``sam_tail_weight``: its code doubles it).
The head part's gradient is kept; the tail part's gradient gives ε; the tail part's gradient at w + ε is added
to the kept head gradient for the step from w.

Across ranks every gradient here is the global batch's: :class:`~.step.GradAllReduce` sums it over the ranks
after each backward pass (DDP's hooks cannot serve two backward passes of one forward), so every rank takes
the same ε — one global perturbation — at any world size. Everything stays on the device (no value is read
back), so the step can be captured like the plain one; the buffers it keeps are made by its first (eager)
steps.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

EPS = 1e-12
"""Added to ‖g‖ (Saddle-LongTail's ``sam.py``; ImbSAM's ``imbsam.py`` adds 1e-16)."""

Terms = Callable[[], tuple[Tensor, Tensor, Tensor]]
"""A forward pass: (per-sample loss values, the factor making their sum this rank's share, the targets)."""


class SharpnessAware:
    """One SAM or ImbSAM step over ``params`` (the optimizer's). ``tail_classes``: a ``(C,)`` bool tensor of
    ImbSAM's tail classes, None for SAM on every class. ``sync``: what follows each backward pass before the
    gradients are read (the gradient all-reduce with several ranks; the compute copy's gradients cast into the
    parameters', :mod:`.lean`). ``moved``: what follows the perturbation of the weights (the compute copy
    refreshed)."""

    def __init__(self, params: Sequence[nn.Parameter], rho: float, *, tail_classes: Tensor | None = None,
                 tail_weight: float = 1.0, sync: Callable[[], None] | None = None,
                 moved: Callable[[], None] | None = None) -> None:
        self.params, self.rho = list(params), rho
        self.tail_classes, self.tail_weight = tail_classes, tail_weight
        self.sync = sync or (lambda: None)
        self.moved = moved or (lambda: None)
        self._saved: list[Tensor] = []
        self._kept: list[Tensor] = []

    def _with_grad(self) -> list[nn.Parameter]:
        return [p for p in self.params if p.grad is not None]

    @torch.no_grad()
    def _perturb(self) -> list[nn.Parameter]:
        """w ← w + ρ·g/(‖g‖ + eps), the weights saved first; returns the parameters that moved."""
        moved = self._with_grad()
        grads = [p.grad for p in moved]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else None
        if len(self._saved) != len(moved):
            self._saved = [torch.empty_like(p) for p in moved]
        torch._foreach_copy_(self._saved, moved)
        if grads:
            scale = self.rho / (norm + EPS)
            torch._foreach_add_(moved, torch._foreach_mul(grads, scale))
        self.moved()
        return moved

    @torch.no_grad()
    def _restore(self, moved: list[nn.Parameter]) -> None:
        torch._foreach_copy_(moved, self._saved)

    def step(self, loss: Callable[[], Tensor], optimizer: torch.optim.Optimizer) -> Tensor:
        """SAM: two forward-backward passes, one optimizer step; returns the loss at w."""
        optimizer.zero_grad(set_to_none=True)
        first = loss()
        first.backward()
        self.sync()
        moved = self._perturb()
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        self.sync()
        self._restore(moved)
        optimizer.step()
        return first.detach()

    def _split(self, values: Tensor, scale: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        assert self.tail_classes is not None
        tail = self.tail_classes[target].to(values.dtype)  # a gather: no host read, unlike a boolean mask
        return (values * (1 - tail)).sum() * scale, (values * tail).sum() * (scale * self.tail_weight), tail

    def imbalanced_step(self, terms: Terms, optimizer: torch.optim.Optimizer) -> Tensor:
        """ImbSAM: the head part's gradient at w, the tail part's at w + ε (ε from the tail part alone);
        returns the loss at w (head + weighted tail)."""
        optimizer.zero_grad(set_to_none=True)
        values, scale, target = terms()
        head, tail, _ = self._split(values, scale, target)
        head.backward(retain_graph=True)
        self.sync()
        with torch.no_grad():
            kept = self._with_grad()
            if len(self._kept) != len(kept):
                self._kept = [torch.empty_like(p) for p in kept]
            torch._foreach_copy_(self._kept, [p.grad for p in kept])
        optimizer.zero_grad(set_to_none=True)
        tail.backward()
        self.sync()
        moved = self._perturb()
        optimizer.zero_grad(set_to_none=True)
        values2, scale2, target2 = terms()
        self._split(values2, scale2, target2)[1].backward()
        self.sync()
        self._restore(moved)
        with torch.no_grad():
            torch._foreach_add_([p.grad for p in kept], self._kept)
        optimizer.step()
        return (head + tail).detach()
