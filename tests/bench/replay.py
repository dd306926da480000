"""Replaying our augmentation draws through torchvision's own transform objects.

Our pipeline draws, per step, the global batch's crop offsets then flips from one generator seeded by
(seed, epoch, step, 0). The reference's ``RandomCrop`` / ``RandomHorizontalFlip`` draw from torch's global RNG instead;
to feed both the same crops, the reference data set below hands each item's (top, left, flip) to the
real transform objects — ``RandomCrop.get_params`` answers with the replayed offsets and the flip's
probability is set to 1 or 0 — so padding, cropping, flipping, ``ToTensor`` and ``Normalize`` are still
torchvision's own code.
"""

from __future__ import annotations

import torch

from benchmarks.reference import CifarLikeDataset
from hpc_train.train.data.samplers import derive_seed


def our_draws(batch: int, padding: int, seed: int, epoch: int, step: int, rank: int = 0):
    """The (offsets, flips) that the trainer draws for this step's global batch (``rank`` stays 0: the
    draws no longer depend on it)."""
    gen = torch.Generator().manual_seed(derive_seed("augment", seed, epoch, step, rank))
    offsets = torch.randint(0, 2 * padding + 1, (batch, 2), generator=gen)
    flips = torch.rand(batch, generator=gen) < 0.5
    return offsets, flips


class ReplayDataset(CifarLikeDataset):
    """The reference data set with each item's crop and flip fixed in advance: ``params[index]`` is
    ``(top, left, flip)``."""

    current: tuple[int, int] = (0, 0)

    def __init__(self, images, labels, transform, params: dict[int, tuple[int, int, bool]]) -> None:
        super().__init__(images, labels, transform)
        self.params = params
        crop, flip = transform.transforms[0], transform.transforms[1]
        owner = self

        def get_params(img, output_size):  # RandomCrop.get_params's signature; returns (i, j, h, w)
            h, w = output_size
            return owner.current[0], owner.current[1], h, w

        crop.get_params = get_params  # instance attribute: only this transform object is replayed
        self._flip = flip

    def __getitem__(self, index: int):
        top, left, flip = self.params[index]
        self.current = (top, left)
        self._flip.p = 1.0 if flip else 0.0
        return super().__getitem__(index)


def epoch_params(sampler, epoch: int, batch: int, padding: int, seed: int) -> tuple[list[list[int]], dict]:
    """Our batches of ``epoch`` (index lists) and every index's (top, left, flip) in them."""
    batches, params = [], {}
    for step, (idx, _) in enumerate(sampler.batches(epoch, 0, 1, batch)):
        offsets, flips = our_draws(len(idx), padding, seed, epoch, step)
        batches.append(idx.tolist())
        for i, index in enumerate(idx.tolist()):
            assert index not in params, "an instance sampler draws every index once per epoch"
            params[index] = (int(offsets[i, 0]), int(offsets[i, 1]), bool(flips[i]))
    return batches, params
