"""Mixup's draws per global batch (Zhang et al. 2018, as MiSLAS's stage 1 uses it).

MiSLAS's ``methods.py`` (``mixup_data``, ``mixup_criterion``) draws λ ~ Beta(α, α) and a permutation π of the
batch, trains on λ·x + (1 - λ)·x[π] and takes λ·L(y) + (1 - λ)·L(y[π]). Here λ and π belong to the *global*
batch: they are drawn from (seed, epoch, step) alone — λ first, then π, as MiSLAS does — so every rank knows
them and the result does not depend on the world size. Rank r, holding positions r::W, mixes each of its
images with the image at the permuted position, wherever that image's rank is: every rank holds the whole
in-memory training set, so it gathers its partners' images itself, augmented as drawn for their own
positions. (Data sets streamed from disk would need their partners loaded too; they are not mixed.)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .samplers import derive_seed


def draw(alpha: float, seed: int, epoch: int, step: int, size: int) -> tuple[float, Tensor]:
    """λ and π of the global batch ``step`` of ``epoch`` with ``size`` images."""
    rng = np.random.default_rng(derive_seed("mixup", seed, epoch, step))
    lam = float(rng.beta(alpha, alpha))
    return lam, torch.from_numpy(rng.permutation(size).astype(np.int64))


def partner_tables(whole: Tensor, coords: Tensor | None, perm: Tensor, rank: int,
                   world_size: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """For one global batch (its image indices ``whole`` and augmentation ``coords`` by position): this rank's
    partners' image indices and augmentation, and the permuted batch's image indices (whose targets the
    second loss term normalises over)."""
    mine = perm[rank::world_size]
    return whole[mine], whole[perm], None if coords is None else coords[mine]
