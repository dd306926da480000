"""Batches of on-disk sets (list files, ImageFolder) through DataLoader workers.

A training item is ``(image index, augmentation seed)``: torchvision's RandomResizedCrop + flip (+ color
jitter) run under a per-sample seed drawn for the global batch from (seed, epoch, step) and taken by
position, so the workers' own RNG plays no part and an image gets the same augmentation at any world
size. Evaluation items are plain indices of the rank's unpadded shard.
"""

from __future__ import annotations

import torch
import torch.utils.data

from .datasets import FileSplit
from .samplers import GlobalSampler, derive_seed


class FileImages(torch.utils.data.Dataset):
    """Images of a file split. A training item is ``(index, seed)``: the transform's random draws (from
    torch's global generator, as torchvision's transforms make them) run under that seed."""

    def __init__(self, split: FileSplit, transform) -> None:
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, item: int | tuple[int, int]):
        from PIL import Image

        i, seed = item if isinstance(item, tuple) else (item, None)
        path = self.split.root / self.split.paths[i]
        try:
            with Image.open(path) as img:
                image = img.convert("RGB")
        except OSError as exc:
            raise RuntimeError(f"cannot read image {path}: {exc}") from None
        if seed is None:
            return self.transform(image), int(self.split.labels[i])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.transform(image), int(self.split.labels[i])


def _transforms(size: int, mean, std, train: bool, color_jitter: float = 0.0):
    from torchvision import transforms as T

    if train:
        jitter = [T.ColorJitter(color_jitter, color_jitter, color_jitter, 0)] if color_jitter > 0 else []
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *jitter, T.ToTensor(),
                          T.Normalize(mean, std)])
    return T.Compose([T.Resize(int(round(size * 256 / 224))), T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])


def augment_seeds(seed: int, epoch: int, step: int, global_size: int) -> torch.Tensor:
    """One seed per position of a global batch, for file sets' per-sample transforms."""
    gen = torch.Generator().manual_seed(derive_seed("augment-files", seed, epoch, step))
    return torch.randint(0, 2**62, (global_size,), generator=gen)


class _ShardBatches(torch.utils.data.Sampler):
    """Batch sampler of one rank's share of every global batch, as ``(index, augmentation seed)``
    items; the trainer sets (epoch, start_step) before each epoch."""

    def __init__(self, sampler: GlobalSampler, rank: int, world_size: int, batch: int, seed: int) -> None:
        self.sampler, self.rank, self.world_size, self.batch, self.seed = sampler, rank, world_size, batch, seed
        self.epoch, self.start_step = 0, 0

    def __iter__(self):
        batches = self.sampler.batches(self.epoch, self.rank, self.world_size, self.batch, self.start_step)
        for step, (idx, whole) in enumerate(batches, self.start_step):
            seeds = augment_seeds(self.seed, self.epoch, step, len(whole))[self.rank::self.world_size]
            yield list(zip(idx.tolist(), seeds.tolist()))

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch(self.batch) - self.start_step


class _CollateOrEmpty:
    """default_collate, and an empty batch of the right shape for a rank with no image in a step (the
    last, short global batch of an epoch can have fewer images than ranks)."""

    def __init__(self, image_size: int) -> None:
        self.image_size = image_size

    def __call__(self, items):
        if not items:
            return torch.zeros(0, 3, self.image_size, self.image_size), torch.zeros(0, dtype=torch.int64)
        return torch.utils.data.default_collate(items)


class _IndexBatches(torch.utils.data.Sampler):
    def __init__(self, indices: range, batch: int) -> None:
        self.indices, self.batch = indices, batch

    def __iter__(self):
        for start in range(0, len(self.indices), self.batch):
            yield list(self.indices[start: start + self.batch])

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch)
