"""How a phase's step is put together: the module the batch goes through, the gradient synchronisation and
the sharpness-aware part (the Trainer builds the rest of a phase: :meth:`~.engine.Trainer._setup_phase`).

Eager steps at world size > 1 go through DDP, whose bucketed all-reduce overlaps the backward pass. A captured
step cannot replay DDP's hooks, and SAM's step backpropagates twice per forward pass (ImbSAM) or runs two
forward-backward pairs per optimizer step: both use the plain model with :class:`~.step.GradAllReduce` —
DDP's synchronisation written out, tested bit for bit against DDP — after every backward pass, so SAM's
ascent gradient is the global batch's before the weights move.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ...config import TrainConfig
from ..data.pipeline import DeviceImages
from . import graphs
from .context import RankContext
from .lean import ComputeWeights, LeanForward
from .sam import SharpnessAware
from .step import GradAllReduce, StepState, TrainStep, eager_forward


def sharpness_aware(cfg: TrainConfig, optimizer: torch.optim.Optimizer, counts: Sequence[int],
                    device: torch.device, grad_sync: GradAllReduce | None,
                    weights: ComputeWeights | None = None) -> SharpnessAware | None:
    """SAM, or ImbSAM with ``optim.sam_tail_below``, over the optimizer's parameters (None when ``sam_rho`` is 0);
    ``weights``: the compute copy the forward passes read (:mod:`.lean`)."""
    o = cfg.optim
    if not o.sam_rho:
        return None
    params = [p for g in optimizer.param_groups for p in g["params"]]
    tail = None
    if o.sam_tail_below:
        tail = torch.tensor([n < o.sam_tail_below for n in counts], dtype=torch.bool, device=device)

    def sync() -> None:
        if weights is not None:
            weights.to_params()
        if grad_sync is not None:
            grad_sync.after_backward(params)

    moved = None if weights is None else weights.refresh
    return SharpnessAware(params, o.sam_rho, tail_classes=tail, tail_weight=o.sam_tail_weight, sync=sync,
                          moved=moved)


def lean_forward(cfg: TrainConfig, model: nn.Module, amp_dtype: torch.dtype | None) -> LeanForward:
    """The plain model through :class:`~.lean.LeanForward`, on a copy of its weights in the AMP dtype unless
    ``amp_weight_copy`` is off (autocast then casts them in every pass)."""
    copy = amp_dtype is not None and cfg.amp_weight_copy
    return LeanForward(model, ComputeWeights(model.backbone, amp_dtype) if copy else None)


def assemble_step(cfg: TrainConfig, model: nn.Module, ctx: RankContext, *, captured: bool, criterion: nn.Module,
                  optimizer: torch.optim.Optimizer, state: StepState, counts: Sequence[int],
                  autocast: Callable[[], contextlib.AbstractContextManager], scaler: torch.amp.GradScaler,
                  images: DeviceImages | None, main: bool,
                  amp_dtype: torch.dtype | None = None) -> tuple[nn.Module, TrainStep]:
    """The phase's forward module and its :class:`~.step.TrainStep` (see the module docstring); SAM applies
    to the main stage (``main``), not to stage 2's classifier. The plain model runs as :func:`lean_forward`
    (``amp_dtype``: the AMP dtype, None without AMP); DDP, DataParallel and compile take the model as it is."""
    sharp = bool(cfg.optim.sam_rho) and main
    grad_sync = None
    if captured or (sharp and ctx.distributed):  # the all-reduce is in the step
        if ctx.distributed:
            grad_sync = GradAllReduce(model, ctx.world_size)
            for p in model.parameters():  # as DDP's constructor does
                dist.broadcast(p.data, 0)
        forward: nn.Module = graphs.compile_module(model) if cfg.compile else lean_forward(cfg, model, amp_dtype)
    else:
        forward = eager_forward(model, cfg.strategy, ctx.device, distributed=ctx.distributed)
        if cfg.compile:
            forward = graphs.compile_module(forward)
        elif forward is model:
            forward = lean_forward(cfg, model, amp_dtype)
    weights = forward.weights if isinstance(forward, LeanForward) else None
    sam = sharpness_aware(cfg, optimizer, counts, ctx.device, grad_sync, weights) if sharp else None
    step = TrainStep(forward=forward, criterion=criterion, optimizer=optimizer, state=state, autocast=autocast,
                     scaler=scaler, grad_sync=grad_sync, images=images, sam=sam)
    return forward, step
