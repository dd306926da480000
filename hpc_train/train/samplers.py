"""Distributed samplers: one global index sequence per epoch, cut into global batches, dealt out by rank.

No reference long-tail code samples correctly under DDP: ``ClassAwareSampler`` draws from Python's
global ``random`` in every rank, ``WeightedRandomSampler`` knows nothing of ranks. Here every rank
builds the *same* sequence from ``(seed, epoch)`` alone (a CPU ``torch.Generator``, identical on every
machine) and cuts it into global batches of ``B``: ``seq[sB:(s+1)B]`` is step ``s`` at any world size,
and rank ``r`` of ``W`` trains on ``seq[sB:(s+1)B][r::W]``. Nothing is cut: the last global batch is
short and split unevenly (ranks may differ by one image; a rank may hold none when it has fewer images
than ranks). The losses normalise over the global batch, so the step is the single-process step.

The sampler's state is ``(epoch, step)``, both global: a run resumed at another world size continues
with exactly the batches an uninterrupted run would have taken.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterator

import numpy as np
import torch

from ..config import SamplerName, TrainConfig


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
        self.step = 0
        """Global steps taken in ``epoch`` (the resume point)."""
        self._cached: tuple[int, torch.Tensor] | None = None

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
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        gen = torch.Generator().manual_seed(derive_seed("sampler", self.seed, epoch))
        if self.name == "instance":
            seq = torch.randperm(len(self.by_class), generator=gen)[: self.num_samples]
        else:
            classes = torch.multinomial(self.class_probabilities(epoch).float(), self.num_samples, replacement=True,
                                        generator=gen)
            offsets = (torch.rand(self.num_samples, generator=gen, dtype=torch.float64) * self.counts[classes]).long()
            offsets = torch.minimum(offsets, self.counts[classes] - 1)  # rand() < 1, but be safe at the edge
            seq = self.by_class[self.starts[classes] + offsets]
        self._cached = (epoch, seq)
        return seq

    def steps_per_epoch(self, batch_size: int) -> int:
        """Global batches per epoch, the last one short: the same at every world size."""
        return math.ceil(self.num_samples / batch_size)

    def batches(self, epoch: int, rank: int, world_size: int, batch_size: int,
                start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(this rank's indices, the global batch's indices)`` of every step of ``epoch`` from
        ``start_step`` on (a resumed epoch); ``batch_size`` is the global batch."""
        self.epoch = epoch
        seq = self.global_sequence(epoch)
        for step in range(start_step, self.steps_per_epoch(batch_size)):
            self.step = step
            batch = seq[step * batch_size:(step + 1) * batch_size]
            yield batch[rank::world_size], batch
        self.step = self.steps_per_epoch(batch_size)

    def state_dict(self) -> dict:
        return {"name": self.name, "seed": self.seed, "epoch": self.epoch, "step": self.step,
                "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name or state.get("seed") != self.seed:
            raise ValueError(f"checkpoint sampler {state.get('name')}/seed {state.get('seed')} does not match "
                             f"{self.name}/seed {self.seed}")
        self.epoch, self.step = int(state["epoch"]), int(state.get("step", 0))


def stage_sampler(cfg: TrainConfig, labels: np.ndarray, num_classes: int, phase: str) -> GlobalSampler:
    """The sampler of a stage (``main`` or ``crt``), seeded apart."""
    if phase == "main":
        name, progressive = cfg.sampler.name, cfg.sampler.progressive_epochs or cfg.epochs
    else:
        name, progressive = cfg.two_stage.crt_sampler, cfg.two_stage.crt_epochs
    return GlobalSampler(labels, num_classes, name=name, seed=derive_seed(cfg.seed, phase),
                         progressive_epochs=progressive)


def eval_shard(length: int, rank: int, world_size: int) -> range:
    """Unpadded strided shard for evaluation: every item exactly once across ranks (lengths may differ
    by one — evaluation has no collective per batch, so that is fine)."""
    return range(rank, length, world_size)
