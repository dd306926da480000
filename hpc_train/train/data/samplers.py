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

from ...config import SamplerName, TrainConfig


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from several integers (stable across processes and Python versions, unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def progressive_lambda(stage_epoch: int, epochs: int) -> float:
    """λ of the progressive sampler in the stage's epoch ``stage_epoch`` (from 0): classifier-balancing's
    ``np.linspace(0, 1, epochs)[e]`` with e clipped to [0, epochs - 1] (``reset_weights``)."""
    e = min(max(0, stage_epoch), epochs - 1)
    return e / (epochs - 1) if epochs > 1 else 0.0


class GlobalSampler:
    """Index sequences over a labelled training set; one per epoch, the same on every rank.

    ``instance``: a random permutation of all N images. ``class_balanced``, ``sqrt`` and ``progressive``
    draw N (class, image) pairs with replacement: the class from per-class probabilities, then an image
    of that class uniformly — ``class_balanced`` p_c = 1/C, ``sqrt`` p_c ∝ sqrt(n_c), ``progressive``
    p_c(t) = (1 - λ_t)·n_c/N + λ_t/C with t the epoch *of the stage* (``phase_start_epoch`` is the
    stage's first global epoch) and λ_t = ``linspace(0, 1, T)[min(t, T - 1)]`` = t/(T - 1), T
    ``progressive_epochs`` (Kang et al. 2020 as classifier-balancing's code runs it:
    ``data/MixedPrioritizedSampler.py`` takes λ from ``np.linspace(0, 1, epochs)``, so its last epoch samples
    class-balanced; with T = 1 that list is [0] and sampling stays instance-balanced). ``class_aware`` is
    classifier-balancing's ``ClassAwareSampler``: cycle through the classes in shuffled order, take
    ``per_class_draw`` images from the class's own shuffled cycle each time it comes up; its epoch is
    floor(N / batch_size) whole batches, the steps the reference trains per epoch. Seeds always use the
    global epoch.
    """

    def __init__(self, labels: np.ndarray, num_classes: int, *, name: SamplerName, seed: int,
                 progressive_epochs: int = 1, num_samples: int | None = None, phase_start_epoch: int = 0,
                 per_class_draw: int = 4, batch_size: int = 1) -> None:
        self.name = name
        self.seed = seed
        self.progressive_epochs = max(1, progressive_epochs)
        self.phase_start_epoch = phase_start_epoch
        self.per_class_draw = per_class_draw
        labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        if num_samples is None:
            num_samples = len(labels_t)
            if name == "class_aware":  # classifier-balancing: int(N / batch) steps of a full batch
                num_samples = max(1, num_samples // batch_size) * batch_size
        self.num_samples = num_samples
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
            lam = progressive_lambda(epoch - self.phase_start_epoch, self.progressive_epochs)
            return (1 - lam) * n / n.sum() + lam * uniform
        raise ValueError(f"{self.name} has no class probabilities")

    def global_sequence(self, epoch: int) -> torch.Tensor:
        """The epoch's full index sequence (what a single process would iterate)."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        gen = torch.Generator().manual_seed(derive_seed("sampler", self.seed, epoch))
        if self.name == "instance":
            seq = torch.randperm(len(self.by_class), generator=gen)[: self.num_samples]
        elif self.name == "class_aware":
            seq = self._class_aware(gen)
        else:
            classes = torch.multinomial(self.class_probabilities(epoch).float(), self.num_samples, replacement=True,
                                        generator=gen)
            offsets = (torch.rand(self.num_samples, generator=gen, dtype=torch.float64) * self.counts[classes]).long()
            offsets = torch.minimum(offsets, self.counts[classes] - 1)  # rand() < 1, but be safe at the edge
            seq = self.by_class[self.starts[classes] + offsets]
        self._cached = (epoch, seq)
        return seq

    def _class_aware(self, gen: torch.Generator) -> torch.Tensor:
        """ClassAwareSampler's stream, vectorised: class draws from consecutive shuffled cycles of the
        classes; the m-th draw of class c takes items [k·m, k·m + k) of c's stream of consecutive shuffled
        cycles of its images (k = ``per_class_draw``). The cycles start afresh every epoch (from the
        epoch's seed) where the reference carries its iterators over: the same distribution, and an
        epoch that depends on (seed, epoch) alone."""
        k = self.per_class_draw
        present = torch.nonzero(self.counts > 0).flatten()
        draws = -(-self.num_samples // k)
        cycles = -(-draws // len(present))
        order = torch.cat([present[torch.randperm(len(present), generator=gen)] for _ in range(cycles)])[:draws]
        items = torch.empty(draws, k, dtype=torch.int64)
        by_draw = torch.argsort(order, stable=True)  # draw positions grouped by class, in draw order
        per_class = torch.bincount(order, minlength=len(self.counts))
        first = 0
        for c in present.tolist():
            m = int(per_class[c])
            if m == 0:
                continue
            n_c, start = int(self.counts[c]), int(self.starts[c])
            members = self.by_class[start:start + n_c]
            stream = torch.cat([members[torch.randperm(n_c, generator=gen)] for _ in range(-(-m * k // n_c))])
            items[by_draw[first:first + m]] = stream[: m * k].view(m, k)
            first += m
        return items.flatten()[: self.num_samples]

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
    """The sampler of a stage (``main`` or ``crt``), seeded apart; the progressive schedule counts the
    stage's own epochs."""
    if phase == "main":
        name, progressive, start = cfg.sampler.name, cfg.sampler.progressive_epochs or cfg.epochs, 0
    else:
        name, progressive, start = cfg.two_stage.crt_sampler, cfg.two_stage.crt_epochs, cfg.epochs
    return GlobalSampler(labels, num_classes, name=name, seed=derive_seed(cfg.seed, phase),
                         progressive_epochs=progressive, phase_start_epoch=start,
                         per_class_draw=cfg.sampler.per_class_draw, batch_size=cfg.batch_size)


def eval_shard(length: int, rank: int, world_size: int) -> range:
    """Unpadded strided shard for evaluation: every item exactly once across ranks (lengths may differ
    by one — evaluation has no collective per batch, so that is fine)."""
    return range(rank, length, world_size)
