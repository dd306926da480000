"""Synchronised BatchNorm on any backend, and one copy of the BatchNorm buffers on every rank.

PyTorch's ``nn.SyncBatchNorm`` runs on CUDA only, so CPU ranks (gloo) use :class:`GlobalBatchNorm`:
in training every rank sums, per channel, its images' values and squared values (shifted by the running
mean, which every rank holds identically, to keep the float32 variance free of cancellation) and its
count; one all-reduce gives the global batch's mean and variance. The all-reduce's backward is an
all-reduce of the gradients of those sums, so each rank back-propagates the global batch's statistics
exactly as one process would. Ranks may hold different numbers of images, none included (the last batch
of an epoch). With ``sync_bn: true`` on CPUs it is the BatchNorm of every world size, one process included
(the all-reduce is then skipped), so the arithmetic does not change with the world size. On CUDA
``nn.SyncBatchNorm`` computes the same statistics with fused kernels (``config.sync_bn.kernel`` decides).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) whose gradient is the all-reduced gradient: every rank's output depends on every
    rank's input."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class GlobalBatchNorm(_BatchNorm):
    """BatchNorm over the global batch of all ranks (any input of shape ``N × C × ...``); in training it
    computes the statistics the same way in one process (no all-reduce then). In evaluation it is plain
    BatchNorm (running statistics, which every rank holds identically)."""

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions, got {x.dim()}")

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        together = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        view = (1, c) + (1,) * (x.dim() - 2)
        xf = x.float()
        shift = self.running_mean.detach().float() if self.running_mean is not None else xf.new_zeros(c)
        centred = xf - shift.view(view)
        count = xf.new_full((1,), x.numel() // max(c, 1))
        sums = torch.cat([centred.sum(dims), (centred * centred).sum(dims), count])
        total = _SumOverRanks.apply(sums) if together else sums
        n = total[2 * c]
        mean_shifted = total[:c] / n
        var = (total[c:2 * c] / n - mean_shifted * mean_shifted).clamp_min(0)  # biased, as BatchNorm normalises
        mean = mean_shifted + shift
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 1.0 / self.num_batches_tracked.float()
                self.running_mean.mul_(1 - m).add_(m * mean.detach().to(self.running_mean.dtype))
                unbiased = var.detach() * (n / (n - 1).clamp_min(1))
                self.running_var.mul_(1 - m).add_(m * unbiased.to(self.running_var.dtype))
        y = (xf - mean.view(view)) * torch.rsqrt(var.view(view) + self.eps)
        if self.affine:
            y = y * self.weight.view(view) + self.bias.view(view)
        return y.to(x.dtype)


def synchronise_batchnorm(model: nn.Module, kernel: str) -> nn.Module:
    """``model`` with every BatchNorm synchronised across ranks (weights and buffers kept), by the kernel
    ``config.sync_bn.kernel`` chose: ``fused`` CUDA's SyncBatchNorm, ``global`` GlobalBatchNorm,
    ``batchnorm`` none (the model as it is)."""
    if kernel == "fused":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return _convert(model) if kernel == "global" else model


def _convert(module: nn.Module) -> nn.Module:
    if isinstance(module, _BatchNorm) and not isinstance(module, (GlobalBatchNorm, nn.SyncBatchNorm)):
        bn = GlobalBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                             module.track_running_stats)
        bn.load_state_dict(module.state_dict())
        bn.train(module.training)
        return bn
    for name, child in module.named_children():
        module.add_module(name, _convert(child))
    return module


@torch.no_grad()
def broadcast_buffers(module: nn.Module, src: int = 0) -> None:
    """Every rank gets rank ``src``'s buffers (BatchNorm statistics), one broadcast per dtype: without
    synchronised BatchNorm each rank's statistics are its own, and evaluation and checkpoint must use the
    one model that is saved."""
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for buf in module.buffers():
        by_dtype.setdefault(buf.dtype, []).append(buf)
    for buffers in by_dtype.values():
        flat = torch.cat([b.reshape(-1) for b in buffers])
        dist.broadcast(flat, src)
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()
