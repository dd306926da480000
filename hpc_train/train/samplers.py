"""Distributed samplers: one global index sequence per epoch, cut and sharded by rank.

No reference long-tail code samples correctly under DDP: ``ClassAwareSampler`` draws from Python's
global ``random`` in every rank, ``WeightedRandomSampler`` knows nothing of ranks. Here every rank
builds the *same* sequence from ``(seed, epoch)`` alone (a CPU ``torch.Generator``, identical on every
machine), cuts it to a multiple of the world size and keeps every ``world_size``-th element starting at
its rank. So the shards are disjoint, equally long (no rank waits on another at the last step), their
union is the single-process sequence minus at most ``world_size - 1`` items, and because the sequence is
re-shuffled every epoch the cut tail is different each epoch.

The sampler's state is ``(epoch, position)``; the trainer checkpoints it and resumes mid-epoch.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterator

import numpy as np
import torch

from ..config import SamplerName


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from several integers (stable across processes and Python versions, unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class GlobalSampler:
    """Index sequences over a labelled training set; one per epoch, the same on every rank.

    ``instance``: a random permutation of all N images. The others draw N (class, image) pairs with
    replacement: the class from per-class probabilities, then an image of that class uniformly —
    ``class_balanced`` p_c = 1/C, ``sqrt`` p_c ∝ sqrt(n_c), ``progressive`` p_c(t) = (1 - t/T)·n_c/N +
    (t/T)/C with t the epoch and T ``progressive_epochs`` (Kang et al. 2020).
    """

    def __init__(self, labels: np.ndarray, num_classes: int, *, name: SamplerName, seed: int,
                 progressive_epochs: int = 1, num_samples: int | None = None) -> None:
        self.name = name
        self.seed = seed
        self.progressive_epochs = max(1, progressive_epochs)
        labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        self.num_samples = num_samples if num_samples is not None else len(labels_t)
        self.counts = torch.bincount(labels_t, minlength=num_classes)
        # Images grouped by class: class c owns by_class[starts[c] : starts[c] + counts[c]].
        self.by_class = torch.argsort(labels_t, stable=True)
        self.starts = torch.cumsum(self.counts, 0) - self.counts
        self.epoch = 0
        self.position = 0
        """Samples this rank has consumed in ``epoch`` (resume point)."""

    def class_probabilities(self, epoch: int) -> torch.Tensor:
        n = self.counts.double()
        present = (n > 0).double()
        uniform = present / present.sum()
        if self.name == "class_balanced":
            return uniform
        if self.name == "sqrt":
            return n.sqrt() / n.sqrt().sum()
        if self.name == "progressive":
            t = min(1.0, epoch / self.progressive_epochs)
            return (1 - t) * n / n.sum() + t * uniform
        raise ValueError(f"{self.name} has no class probabilities")

    def global_sequence(self, epoch: int) -> torch.Tensor:
        """The epoch's full index sequence (what a single process would iterate)."""
        gen = torch.Generator().manual_seed(derive_seed("sampler", self.seed, epoch))
        if self.name == "instance":
            return torch.randperm(len(self.by_class), generator=gen)[: self.num_samples]
        classes = torch.multinomial(self.class_probabilities(epoch).float(), self.num_samples, replacement=True,
                                    generator=gen)
        offsets = (torch.rand(self.num_samples, generator=gen, dtype=torch.float64) * self.counts[classes]).long()
        offsets = torch.minimum(offsets, self.counts[classes] - 1)  # rand() < 1, but be safe at the edge
        return self.by_class[self.starts[classes] + offsets]

    @staticmethod
    def usable_length(length: int, world_size: int) -> int:
        return length - length % world_size

    def shard(self, epoch: int, rank: int, world_size: int) -> torch.Tensor:
        """This rank's part of the epoch: the sequence cut to a multiple of ``world_size``, strided by rank."""
        seq = self.global_sequence(epoch)
        return seq[: self.usable_length(len(seq), world_size)][rank::world_size]

    def samples_per_rank(self, world_size: int) -> int:
        return self.usable_length(self.num_samples, world_size) // world_size

    def steps_per_epoch(self, world_size: int, batch_per_rank: int) -> int:
        # The last batch may be short; it is equally short on every rank, so DDP stays in step.
        return math.ceil(self.samples_per_rank(world_size) / batch_per_rank)

    def batches(self, epoch: int, rank: int, world_size: int, batch_per_rank: int,
                start_step: int = 0) -> Iterator[torch.Tensor]:
        """Index batches of this rank for ``epoch``, from ``start_step`` on (a resumed epoch)."""
        self.epoch = epoch
        shard = self.shard(epoch, rank, world_size)
        for start in range(start_step * batch_per_rank, len(shard), batch_per_rank):
            self.position = start
            yield shard[start: start + batch_per_rank]
        self.position = len(shard)

    def state_dict(self) -> dict:
        return {"name": self.name, "seed": self.seed, "epoch": self.epoch, "position": self.position,
                "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name or state.get("seed") != self.seed:
            raise ValueError(f"checkpoint sampler {state.get('name')}/seed {state.get('seed')} does not match "
                             f"{self.name}/seed {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def eval_shard(length: int, rank: int, world_size: int) -> range:
    """Unpadded strided shard for evaluation: every item exactly once across ranks (lengths may differ
    by one — evaluation has no collective per batch, so that is fine)."""
    return range(rank, length, world_size)
