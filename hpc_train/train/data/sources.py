"""What every data set is made of: splits in memory (:class:`ArraySplit`) or on disk (:class:`FileSplit`), the
:class:`DataSource` a loader returns, :class:`DataError`, and the long-tail and held-out cuts the loaders
share (numpy only). The loaders are :mod:`.datasets` (arrays) and :mod:`.file_sets` (files on disk).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ...config import DataConfig
from ...errors import HpcTrainError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class DataError(HpcTrainError):
    """The data set is missing, incomplete or unreadable; the message names the expected files (exit 2)."""


@dataclass
class ArraySplit:
    """Images held in memory: uint8 ``N×C×H×W`` and int64 labels (small sets; they go to the device)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class FileSplit:
    """Images on disk: paths relative to ``root`` and int64 labels (large sets; DataLoader workers)."""

    root: Path
    paths: list[str]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


Split = ArraySplit | FileSplit


@dataclass
class DataSource:
    name: str
    num_classes: int
    train: Split
    test: Split
    val: Split | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    in_channels: int
    image_size: int
    """Side of the model's input (crop size)."""
    class_names: list[str] = field(default_factory=list)

    @property
    def in_memory(self) -> bool:
        return isinstance(self.train, ArraySplit)

    @property
    def train_counts(self) -> np.ndarray:
        return np.bincount(self.train.labels, minlength=self.num_classes)


# --------------------------------------------------------------------------------------------------
# The long-tail profile (LDAM-DRW's get_img_num_per_cls / gen_imbalanced_data)
# --------------------------------------------------------------------------------------------------


def longtail_counts(n_max: float, num_classes: int, imbalance_factor: float, profile: str = "exp") -> list[int]:
    """Per-class sizes, head (class 0) to tail, with LDAM-DRW's ``int()`` truncation.

    ``step`` gives the first ``C // 2`` classes ``n_max`` and the rest ``n_max / IF`` (LDAM-DRW's code
    drops the last class when C is odd; we give it the tail size).
    """
    imb = 1.0 / imbalance_factor  # LDAM-DRW's imb_factor (0.01 for IF 100); same float as its literals
    if imbalance_factor == 1:
        return [int(n_max)] * num_classes
    if profile == "exp":
        return [int(n_max * (imb ** (i / (num_classes - 1.0)))) for i in range(num_classes)]
    if profile == "step":
        head = num_classes // 2
        return [int(n_max)] * head + [int(n_max * imb)] * (num_classes - head)
    raise ValueError(profile)


def longtail_indices(labels: np.ndarray, counts: Sequence[int], seed: int) -> np.ndarray:
    """Indices of the long-tailed subset: per class in label order, shuffle its indices with one
    ``RandomState(seed)`` (the same stream as LDAM-DRW's ``np.random.seed(0)`` + ``np.random.shuffle``)
    and keep the first ``counts[c]``. Returned grouped by class, as LDAM-DRW stores them."""
    rng = np.random.RandomState(seed)
    picked = []
    for cls, n in zip(np.unique(labels), counts):
        idx = np.where(labels == cls)[0]
        rng.shuffle(idx)
        picked.append(idx[:n])
    return np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)


def holdout_indices(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split off ``fraction`` of every class (at least one image, never a class's last one) as a held-out
    split. Returns (kept, held_out) positions into ``labels``."""
    rng = np.random.RandomState(seed)
    keep, held = [], []
    for cls in np.unique(labels):
        idx = np.where(labels == cls)[0]
        rng.shuffle(idx)
        k = min(max(1, int(len(idx) * fraction)), len(idx) - 1)
        held.append(idx[:k])
        keep.append(idx[k:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(held))


def take(split: Split, idx: np.ndarray) -> Split:
    if isinstance(split, ArraySplit):
        return ArraySplit(split.images[idx], split.labels[idx])
    return FileSplit(split.root, [split.paths[i] for i in idx], split.labels[idx])


def with_holdout(train: Split, cfg: DataConfig) -> tuple[Split, Split | None]:
    if cfg.val_fraction <= 0:
        return train, None
    keep, held = holdout_indices(train.labels, cfg.val_fraction, cfg.seed + 1)
    return take(train, keep), take(train, held)
