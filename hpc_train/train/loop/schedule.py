"""Learning rate as a pure function of (epoch, step): nothing to restore on resume but the position.

``multistep`` with ``warmup_epochs: 5, milestones: [160, 180], gamma: 0.01`` is LDAM-DRW's
``adjust_learning_rate`` exactly: lr·(e+1)/5 in epoch indices 0–4, lr·0.01 from index 160 and lr·0.0001
from 180 (its epochs count from 1: "epoch > 160"). ``cosine`` decays to 0 after the warm-up, per step, or
with ``update: epoch`` once per epoch as classifier-balancing's ``CosineAnnealingLR`` does: it is stepped at
the start of every epoch, so epoch e (from 0) trains at the rate for e + 1 and the last epoch at 0; with
``update: epoch_start`` epoch e trains at the rate for e, MiSLAS's ``adjust_learning_rate`` (cos(e·π/E): the
first epoch at the full rate, the last above 0).

:class:`EpochRates` holds what the schedule says for the current epoch's steps, in the forms the step reads it
(a device table and tensor for fused SGD and capturable AdamW, a host list for plain AdamW): the one owner of the
learning rate while training.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from ...config import ScheduleConfig, TrainConfig


class LrSchedule:
    def __init__(self, cfg: ScheduleConfig, base_lr: float, epochs: int) -> None:
        self.name, self.base_lr, self.epochs = cfg.name, base_lr, epochs
        self.warmup, self.milestones, self.gamma = cfg.warmup_epochs, tuple(cfg.milestones), cfg.gamma
        self.update = cfg.update

    def lr(self, epoch: int, step: int = 0, steps_per_epoch: int = 1) -> float:
        if epoch < self.warmup:
            return self.base_lr * (epoch + 1) / self.warmup
        if self.name == "multistep":
            return self.base_lr * self.gamma ** sum(epoch >= m for m in self.milestones)
        if self.name == "cosine":
            span = max(1, self.epochs - self.warmup)
            within = {"epoch": 1, "epoch_start": 0}.get(self.update, step / max(1, steps_per_epoch))
            done = epoch - self.warmup + within
            progress = min(1.0, done / span)
            return self.base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.base_lr

    def state_dict(self) -> dict:
        return {"name": self.name, "base_lr": self.base_lr, "epochs": self.epochs, "warmup": self.warmup,
                "milestones": list(self.milestones), "gamma": self.gamma,
                "update": self.update}


def scaled_lr(cfg: TrainConfig, lr: float) -> float:
    """``lr`` for the job's global batch: scaled linearly from ``optim.base_batch_size`` when ``optim.scale_lr``."""
    return lr * cfg.batch_size / cfg.optim.base_batch_size if cfg.optim.scale_lr else lr


def reads_tensor_lr(optimizer: torch.optim.Optimizer) -> bool:
    """The optimizer reads its rate from a tensor (fused SGD, capturable AdamW), not from a float."""
    return all(isinstance(g["lr"], Tensor) for g in optimizer.param_groups)


class EpochRates:
    """The learning rate of every step of the current epoch: the one owner of the rate once the schedule has
    said it. The rates are computed on the host once per epoch (:meth:`start_epoch`) and kept in the two forms
    an optimizer can read, filled together so they cannot disagree:

    * on the device, a table of the epoch's rates (float32, as the optimizer would round them) and the 0-dim
      tensor :attr:`tensor` a tensor-lr optimizer reads; the step copies its row into it with one
      ``index_select`` at the step's device position — no host value, so a CUDA graph replays it;
    * on the host, the list of floats, for the plain float-lr AdamW (eager only): each step takes the next one
      (a host cursor that advances as the device position does), and for the progress line and the checkpoint,
      which record the rate a step took (:meth:`took`) without reading the device.
    """

    def __init__(self, device: torch.device) -> None:
        self._box = torch.zeros(1, dtype=torch.float32, device=device)
        self.tensor = self._box.view(())
        """0-dim float32, a view of the box the step selects into: the learning rate a tensor-lr optimizer reads."""
        self._table = torch.zeros(0, dtype=torch.float32, device=device)
        self._host: list[float] = []
        self._host_next = 0
        self.schedule: LrSchedule | None = None
        self._first_epoch = 0
        self._last_taken: float | None = None

    def start_phase(self, schedule: LrSchedule, first_epoch: int) -> None:
        """A phase's schedule, whose epoch 0 is the run's ``first_epoch``; the rate reads its base value until the
        first epoch starts (what an optimizer built now is given)."""
        self.schedule, self._first_epoch = schedule, first_epoch
        self.tensor.fill_(schedule.base_lr)

    def start_epoch(self, epoch: int, steps_per_epoch: int, start_step: int) -> None:
        """The schedule's rates for the run's ``epoch``, whose steps run from ``start_step`` on."""
        assert self.schedule is not None, "start_phase first"
        local = epoch - self._first_epoch
        self.set_epoch([self.schedule.lr(local, s, steps_per_epoch) for s in range(steps_per_epoch)], start_step)

    def set_epoch(self, rates: Sequence[float], start_step: int) -> None:
        """These rates for the epoch's steps (computed on the host, rounded to float32 on the device as the
        optimizer would); in place, stream-ordered after the steps already queued."""
        self._host, self._host_next = list(rates), start_step
        table = torch.tensor(self._host, dtype=torch.float32)
        if self._table.shape != table.shape:
            self._table = torch.empty_like(table, device=self._box.device)
        pinned = table.pin_memory() if self._box.device.type == "cuda" else table
        self._table.copy_(pinned, non_blocking=True)

    def load(self, optimizer: torch.optim.Optimizer, position: Tensor) -> None:
        """Inside the step: the rate of the step at ``position`` (``(1,)`` int64 on the device) where
        ``optimizer`` reads it."""
        if reads_tensor_lr(optimizer):
            torch.index_select(self._table, 0, position, out=self._box)
            return
        rate = self._host[self._host_next]  # plain AdamW (eager only): the host knows the rate
        self._host_next += 1
        for group in optimizer.param_groups:
            group["lr"] = rate

    def took(self, step: int) -> float:
        """The step ``step`` of the epoch has been taken: its rate (the host's number)."""
        self._last_taken = self._host[step]
        return self._last_taken

    def checkpoint_lr(self) -> float:
        """The number a checkpoint records as the optimizer's rate: the last step's, or the phase's base rate
        before any step."""
        assert self.schedule is not None
        return self.schedule.base_lr if self._last_taken is None else self._last_taken
