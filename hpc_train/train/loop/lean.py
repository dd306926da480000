"""The lean forward: the weights in the compute dtype once per step, BatchNorm's batch counters in one operation.

Under AMP, autocast casts every convolution's (and linear layer's) float32 weight to the compute dtype in every
forward pass and casts its gradient back in every backward pass: ResNet-32 makes 62 casts a step that way, each
a kernel launch on a GPU. :class:`ComputeWeights` keeps one copy of those weights in the compute dtype instead
(the same strides, so CUDA's multi-tensor copy takes the fast path): the forward pass reads the copy (autocast
finds its operands in the right dtype and casts nothing), the backward pass leaves the gradients on the copy,
:meth:`ComputeWeights.to_params` casts them into the float32 parameters' gradients in one ``_foreach_copy_``, the
optimizer steps the float32 weights as before, and :meth:`ComputeWeights.refresh` rounds them into the copy again
in one ``_foreach_copy_``. Bit for bit what autocast computes: its cast is the same round-to-nearest-even
``_to_copy``, done once instead of per forward, and its gradient is the same low-precision gradient cast to
float32 (tested against autocast). Whatever moves the float32 weights outside the optimizer step (SAM's
perturbation, a checkpoint loaded in place) calls :meth:`~ComputeWeights.refresh` too.

Each BatchNorm layer in training mode also adds 1 to its ``num_batches_tracked`` in every forward pass (31 small
kernels for ResNet-32). :class:`LeanForward` hides those counters from their layers while the model runs (they
are only read when ``momentum`` is None, which these layers are not) and adds 1 to all of them in one
``_foreach_add_`` — the same counts after every forward pass, SAM's two included.

The alternative to both is ``compile: true`` (compiled inside the CUDA graph), which fuses the casts, and
BatchNorm with ReLU besides: which of the two is faster on a GPU is for the GPU session to measure
(BENCHMARKS.md). The lean forward is used where the step runs the plain model (no DDP wrapper, no compile).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor, nn

LOW_PRECISION_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
"""Layers whose weights autocast casts to the compute dtype (its lower-precision op list: convolutions, linear)."""

COUNTING_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
"""BatchNorm layers whose counter may be hidden (exactly these classes: SyncBatchNorm and hpc-train's
GlobalBatchNorm insist on their counter)."""


class ComputeWeights:
    """One copy of the backbone's convolution and linear weights (and biases) in ``dtype`` (module docstring).
    The classifier is not copied: it runs in float32 (:class:`~.models.LongTailNet`)."""

    def __init__(self, backbone: nn.Module, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.slots: list[tuple[nn.Module, str, nn.Parameter, Tensor]] = []
        for module in backbone.modules():
            if not isinstance(module, LOW_PRECISION_LAYERS):
                continue
            for name in ("weight", "bias"):
                param = module._parameters.get(name)
                if param is None or param.dtype != torch.float32:
                    continue
                copy = torch.empty_like(param, dtype=dtype).requires_grad_(param.requires_grad)
                self.slots.append((module, name, param, copy))
        self.params = [p for _, _, p, _ in self.slots]
        self.copies = [c for _, _, _, c in self.slots]
        self.grads = [torch.empty_like(p) for p in self.params]
        """The float32 gradients of the copied parameters, kept: what the optimizer (and a captured step) reads."""
        self.trainable = any(c.requires_grad for c in self.copies)
        """Some copied weight is trained (not so in stage 2, whose backbone is frozen): the copy must follow it."""
        self.refresh()

    def __len__(self) -> int:
        return len(self.slots)

    @torch.no_grad()
    def refresh(self) -> None:
        """The copies from the float32 weights, rounded as autocast rounds (one fused copy)."""
        if self.copies:
            torch._foreach_copy_(self.copies, self.params)

    def swapped(self) -> Iterator[tuple[dict, str, Tensor]]:
        """(parameter dict, name, the copy) of every copied parameter: what the forward pass reads instead."""
        for module, name, _, copy in self.slots:
            yield module._parameters, name, copy

    @torch.no_grad()
    def to_params(self) -> None:
        """After a backward pass: the copies' gradients cast into the float32 parameters' ``grad`` (one fused
        copy), the copies' gradients cleared for the next backward pass (none of them accumulates)."""
        pairs = [(g, c.grad, p) for g, c, p in zip(self.grads, self.copies, self.params) if c.grad is not None]
        if pairs:
            torch._foreach_copy_([g for g, _, _ in pairs], [cg for _, cg, _ in pairs])
        for grad, _, param in pairs:
            param.grad = grad
        for copy in self.copies:
            copy.grad = None


class LeanForward(nn.Module):
    """``module`` run with its BatchNorm counters advanced in one operation and, with ``weights``, on the copy of
    its weights in the compute dtype (module docstring). ``module`` is the plain model (no wrapper)."""

    def __init__(self, module: nn.Module, weights: ComputeWeights | None = None) -> None:
        super().__init__()
        self.module = module
        self.weights = weights
        self.batchnorms = [m for m in module.modules() if type(m) in COUNTING_BATCHNORM]

    def forward(self, x: Tensor) -> Tensor:
        swaps = list(self.weights.swapped()) if self.weights is not None else []
        counting = [m for m in self.batchnorms if m.training and m.track_running_stats and m.momentum is not None
                    and m.num_batches_tracked is not None]
        counters = [m.num_batches_tracked for m in counting]
        swaps += [(m._buffers, "num_batches_tracked", None) for m in counting]
        kept = [(slots, name, slots[name]) for slots, name, _ in swaps]
        try:
            for slots, name, replacement in swaps:
                slots[name] = replacement
            out = self.module(x)
        finally:
            for slots, name, original in kept:
                slots[name] = original
        if counters:
            with torch.no_grad():
                torch._foreach_add_(counters, 1)
        return out
