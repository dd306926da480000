"""The training step as a function of device state only: what a CUDA graph captures, and what every
other path (the CPU, the fallback, the tests) runs eagerly — one formulation, bit for bit the
arithmetic of the per-batch loop it replaced.

Everything that changes from step to step lives in device tensors the step reads or updates in place
(:class:`StepState`): the position in the epoch (which row of the epoch's :class:`~.plan.EpochPlan`
is this step's batch, augmentation and targets), the last loss and a value that turns NaN at a non-finite
loss; the learning rate is the epoch's rates' (:class:`~.schedule.EpochRates`: a table the position indexes,
read into the tensor the fused optimizer reads by one ``index_select``). The DRW class weights and LDAM margins are buffers of the loss,
switched in place by ``set_epoch``. So a step is the same kernels reading the same addresses every time, and
the host's only per-step work is to launch it (or to replay its graph).

SGD is ``torch.optim.SGD(fused=True)`` with a tensor lr: one kernel, no host value, and on the CPU bit
for bit the for-loop SGD with a float lr (tested). AdamW's fused kernel rounds differently from the
plain one, so AdamW is fused and ``capturable`` (tensor lr, step counts on the device; without the flag
torch's capture health check refuses the step and the run would fall back to eager) only where steps are
captured, and keeps the plain float-lr AdamW elsewhere.

At world size > 1 the eager path keeps DDP (its bucketed all-reduce overlaps the backward pass). A
captured step cannot replay DDP's hooks, so :class:`GradAllReduce` writes out what DDP does —
BatchNorm buffers broadcast from rank 0 before the forward, gradients × 1/W summed in one all-reduce —
and a test checks that it gives DDP's gradients and buffers. The sharpness-aware step (:mod:`.sam`, two
backward passes per step) uses it on the eager path too.

Mixup (``mixup_alpha``) mixes this rank's images with their partners in the global batch (:class:`Mixed`:
the partners' images, targets and λ come from the epoch plan, drawn per global batch); the loss is
λ·L(y) + (1 - λ)·L(y[π]), each normalised over the global batch as always.

Where the step runs the plain model, it runs it through :class:`~.lean.LeanForward`: under AMP on one copy of
the weights in the compute dtype, refreshed after every optimizer step, and with BatchNorm's counters advanced
together (:mod:`.lean`).

A phase's step is put together here too (:func:`assemble_step`; the Trainer builds the rest of a phase). Eager
steps at world size > 1 go through DDP, whose bucketed all-reduce overlaps the backward pass. A captured step
cannot replay DDP's hooks, and SAM's step backpropagates twice per forward pass (ImbSAM) or runs two
forward-backward pairs per optimizer step: both use the plain model with :class:`GradAllReduce` after every
backward pass, so SAM's ascent gradient is the global batch's before the weights move.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ...config import TrainConfig
from ..data.pipeline import DeviceImages, EpochPlan
from ..model.batchnorm import broadcast_buffers
from .context import RankContext
from .lean import ComputeWeights, LeanForward
from .sam import SharpnessAware
from .schedule import EpochRates


def eager_forward(model: nn.Module, strategy: str, device: torch.device, *, distributed: bool) -> nn.Module:
    """The model as an eager step runs it: DDP across ranks, legacy DataParallel, or the model itself."""
    if strategy == "ddp" and distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        return DDP(model, device_ids=ids, output_device=device.index if ids else None)
    if strategy == "dp":
        # Legacy single-process DataParallel: scatters each batch over the visible GPUs of this node
        # (on CPU it simply calls the model). Kept for old recipes; DDP is faster.
        return nn.DataParallel(model)
    return model


@dataclass
class StepState:
    """The per-step values, on the device (see the module docstring); the rate is :class:`~.schedule.EpochRates`'."""

    position: Tensor
    """``(1,)`` int64: the step's index in the epoch (row of the plan and of the epoch's rates)."""
    loss: Tensor
    """0-dim float32: the last step's loss (this rank's share)."""
    nonfinite: Tensor
    """0-dim float32: 0 × every loss so far, summed — 0 while they were finite, NaN from the first that was not
    (0 × inf and 0 × NaN are NaN): one operation a step where a flag took six."""
    zero: Tensor
    """0-dim float32 zero (the factor of ``nonfinite``)."""

    @classmethod
    def on(cls, device: torch.device) -> "StepState":
        return cls(position=torch.zeros(1, dtype=torch.int64, device=device),
                   loss=torch.zeros((), dtype=torch.float32, device=device),
                   nonfinite=torch.zeros((), dtype=torch.float32, device=device),
                   zero=torch.zeros((), dtype=torch.float32, device=device))

    def start_at(self, step: int) -> None:
        """The epoch's steps start at ``step`` (in place, stream-ordered after the steps already queued)."""
        self.position.fill_(step)


def build_optimizer(cfg: TrainConfig, params: list[nn.Parameter], lr: Tensor, *, captured: bool,
                    weight_decay: float | None = None) -> torch.optim.Optimizer:
    """The phase's optimizer reading ``lr`` (see the module docstring); ``weight_decay`` (stage 2's) replaces
    ``optim.weight_decay``. Momentum buffers are created by the first (eager) step, before any capture."""
    o = cfg.optim
    decay = o.weight_decay if weight_decay is None else weight_decay
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=decay,
                               nesterov=o.nesterov, fused=True)
    if captured:  # capturable: torch refuses to capture the step of an optimizer built without it
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay, fused=True, capturable=True)
    return torch.optim.AdamW(params, lr=float(lr), weight_decay=decay)


class GradAllReduce:
    """DDP's synchronisation written out, for a captured step at world size > 1: before the forward
    every rank takes rank 0's buffers (``broadcast_buffers=True``: BatchNorm statistics and counts);
    after the backward the gradients are multiplied by 1/W into one flat buffer (DDP divides while
    copying into its bucket) and summed with one all-reduce. ``world_size`` ranks, default group."""

    def __init__(self, model: nn.Module, world_size: int) -> None:
        self.model, self.world_size = model, world_size

    def before_forward(self) -> None:
        broadcast_buffers(self.model)

    def after_backward(self, params: Sequence[nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(1.0 / self.world_size)
        dist.all_reduce(flat)
        torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(flat.split([g.numel() for g in grads]), grads)])


@dataclass
class Mixed:
    """Mixup partners of this rank's share of a global batch: their images (augmented as drawn for their own
    positions), their targets, the targets of the permuted global batch, and λ (0-dim, on the device)."""

    x: Tensor
    y: Tensor
    y_global: Tensor
    lam: Tensor


class TrainStep:
    """One optimizer step: :meth:`body` from the epoch plan (capturable), :meth:`compute` from a batch
    the host hands over (on-disk data sets). ``forward`` is the module the batch goes through (the
    model, DDP around it, or a compiled one); ``guard`` wraps every step (the tests put
    :class:`~.guard.NoHostSync` there)."""

    def __init__(self, *, forward: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer,
                 state: StepState, rates: EpochRates, autocast: Callable[[], contextlib.AbstractContextManager],
                 scaler: torch.amp.GradScaler, grad_sync: GradAllReduce | None = None,
                 images: DeviceImages | None = None, sam: SharpnessAware | None = None) -> None:
        self.forward, self.criterion, self.optimizer = forward, criterion, optimizer
        self.state, self.autocast, self.scaler, self.grad_sync, self.images = state, autocast, scaler, grad_sync, images
        self.sam, self.rates = sam, rates
        self.weights: ComputeWeights | None = forward.weights if isinstance(forward, LeanForward) else None
        """The copy of the weights in the compute dtype the forward pass reads (:mod:`.lean`), or None."""
        self.plan: EpochPlan | None = None
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def body(self, kind: str) -> None:
        """The step at ``state.position`` of the plan: ``kind`` "full" (a row of the full-batch tables)
        or "last" (the short last batch)."""
        plan, images, pos = self.plan, self.images, self.state.position
        assert plan is not None and images is not None
        with self.guard():
            batch = plan.row(kind, pos)
            x = images.gather(batch.idx, batch.coords)
            mixed = None
            if batch.mix is not None:
                partners = batch.mix
                mixed = Mixed(images.gather(partners.idx, partners.coords), partners.y, partners.y_global,
                              plan.lam_at(kind, pos))
            self._step(x, batch.y, batch.y_global, mixed)

    def compute(self, x: Tensor, y: Tensor, y_global: Tensor) -> None:
        """The step for a batch the host hands over (DataLoader batches)."""
        with self.guard():
            self._step(x, y, y_global)

    def _step(self, x: Tensor, y: Tensor, y_global: Tensor, mixed: Mixed | None = None) -> None:
        state = self.state
        self.rates.load(self.optimizer, state.position)
        if mixed is not None:
            x = mixed.lam * x + (1 - mixed.lam) * mixed.x
        if self.sam is not None:
            done = self._sharpness_aware_step(x, y, y_global, mixed)
        else:
            done = self._plain_step(x, y, y_global, mixed)
        state.loss.copy_(done)
        state.nonfinite.addcmul_(done, state.zero)
        state.position.add_(1)

    def _loss(self, x: Tensor, y: Tensor, y_global: Tensor, mixed: Mixed | None) -> Tensor:
        """This rank's share of the global batch's loss (λ·L(y) + (1 - λ)·L(y[π]) with mixup)."""
        if self.grad_sync is not None:
            self.grad_sync.before_forward()
        with self.autocast():
            logits = self.forward(x)
            loss = self.criterion(logits, y, y_global)
            if mixed is not None:
                loss = mixed.lam * loss + (1 - mixed.lam) * self.criterion(logits, mixed.y, mixed.y_global)
        return loss

    def _plain_step(self, x: Tensor, y: Tensor, y_global: Tensor, mixed: Mixed | None) -> Tensor:
        loss = self._loss(x, y, y_global, mixed)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled():
            self.scaler.scale(loss).backward()
            self._gradients_to_params()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self._gradients_to_params()
            if self.grad_sync is not None:
                self.grad_sync.after_backward(self.params)
            self.optimizer.step()
        self.weights_moved()
        return loss.detach()

    def _gradients_to_params(self) -> None:
        if self.weights is not None:
            self.weights.to_params()

    def weights_moved(self) -> None:
        """The float32 weights changed (the optimizer step, SAM's perturbation): the compute copy follows."""
        if self.weights is not None and self.weights.trainable:
            self.weights.refresh()

    def _sharpness_aware_step(self, x: Tensor, y: Tensor, y_global: Tensor, mixed: Mixed | None) -> Tensor:
        """SAM or ImbSAM (:mod:`.sam`): the same inputs for both passes."""
        sam = self.sam
        assert sam is not None
        if sam.tail_classes is None:
            done = sam.step(lambda: self._loss(x, y, y_global, mixed), self.optimizer)
        else:
            def terms() -> tuple[Tensor, Tensor, Tensor]:
                if self.grad_sync is not None:
                    self.grad_sync.before_forward()
                with self.autocast():
                    values, scale = self.criterion.terms(self.forward(x), y, y_global)
                return values, scale, y

            done = sam.imbalanced_step(terms, self.optimizer)
        self.weights_moved()
        return done


# ------------------------------------------------------------------------------------------------------
# A phase's step, put together
# ------------------------------------------------------------------------------------------------------


def compile_module(module: nn.Module) -> nn.Module:
    """``torch.compile`` with static shapes: one graph per batch shape used (full and last batch), none
    dynamic, and no recompilation after that (the GPU check counts them: :func:`~.graphs.compiled_graphs`)."""
    return torch.compile(module, dynamic=False)


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
                  optimizer: torch.optim.Optimizer, state: StepState, rates: EpochRates, counts: Sequence[int],
                  autocast: Callable[[], contextlib.AbstractContextManager], scaler: torch.amp.GradScaler,
                  images: DeviceImages | None, main: bool,
                  amp_dtype: torch.dtype | None = None) -> tuple[nn.Module, TrainStep]:
    """The phase's forward module and its :class:`TrainStep` (see the module docstring); SAM applies to the main
    stage (``main``), not to stage 2's classifier. The plain model runs as :func:`lean_forward` (``amp_dtype``: the
    AMP dtype, None without AMP); DDP, DataParallel and compile take the model as it is."""
    sharp = bool(cfg.optim.sam_rho) and main
    grad_sync = None
    if captured or (sharp and ctx.distributed):  # the all-reduce is in the step
        if ctx.distributed:
            grad_sync = GradAllReduce(model, ctx.world_size)
            for p in model.parameters():  # as DDP's constructor does
                dist.broadcast(p.data, 0)
        forward: nn.Module = compile_module(model) if cfg.compile else lean_forward(cfg, model, amp_dtype)
    else:
        forward = eager_forward(model, cfg.strategy, ctx.device, distributed=ctx.distributed)
        if cfg.compile:
            forward = compile_module(forward)
        elif forward is model:
            forward = lean_forward(cfg, model, amp_dtype)
    weights = forward.weights if isinstance(forward, LeanForward) else None
    sam = sharpness_aware(cfg, optimizer, counts, ctx.device, grad_sync, weights) if sharp else None
    step = TrainStep(forward=forward, criterion=criterion, optimizer=optimizer, state=state, rates=rates,
                     autocast=autocast, scaler=scaler, grad_sync=grad_sync, images=images, sam=sam)
    return forward, step
