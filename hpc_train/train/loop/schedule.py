"""Learning rate as a pure function of (epoch, step): nothing to restore on resume but the position.

``multistep`` with ``warmup_epochs: 5, milestones: [160, 180], gamma: 0.01`` is LDAM-DRW's
``adjust_learning_rate`` exactly: lr·(e+1)/5 in epoch indices 0–4, lr·0.01 from index 160 and lr·0.0001
from 180 (its epochs count from 1: "epoch > 160"). ``cosine`` decays to 0 after the warm-up, per step, or
with ``update: epoch`` once per epoch as classifier-balancing's ``CosineAnnealingLR`` does: it is stepped at
the start of every epoch, so epoch e (from 0) trains at the rate for e + 1 and the last epoch at 0; with
``update: epoch_start`` epoch e trains at the rate for e, MiSLAS's ``adjust_learning_rate`` (cos(e·π/E): the
first epoch at the full rate, the last above 0).
"""

from __future__ import annotations

import math

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
