"""2. Input pipeline, CIFAR-shaped long-tailed data (CIFAR-10-LT's 12,406 training images, uint8 32×32):
one epoch of augmented, normalised training batches of 128.

* ours: ``hpc_train.train.data.pipeline.Feed`` — the set lives in one uint8 tensor; each batch is gathered,
  randomly cropped (4-pixel zero padding), flipped and normalised as a whole (the trainer's data path);
* reference: torchvision's per-sample PIL ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip`` +
  ``ToTensor`` + ``Normalize`` in a ``DataLoader`` with 2 workers (LDAM-DRW's ``cifar_train.py``).

Both run in this process (the reference's workers are its own child processes) and are consumed the
same way: iterate the epoch, touch nothing. Images per second, medians over interleaved rounds.
"""

from __future__ import annotations

from typing import Any

from .common import CIFAR10_LT_IF100_TRAIN_IMAGES, cifar_shaped_lt, interleave, spread, timer


def run(*, rounds: int, max_per_class: int = 5000, batch: int = 128, workers: int = 2) -> dict[str, Any]:
    import torch

    from hpc_train.train.data.pipeline import Feed
    from hpc_train.train.data.samplers import GlobalSampler

    from . import reference

    data = cifar_shaped_lt(max_per_class, test_per_class=1)
    n = len(data.train)
    sampler = GlobalSampler(data.train.labels, data.num_classes, name="instance", seed=0)
    feeds = {cl: Feed(data, torch.device("cpu"), rank=0, world_size=1, seed=0, crop_padding=4, flip=True,
                      channels_last=cl, num_workers=0) for cl in (False, True)}
    ref_set = reference.CifarLikeDataset(data.train.images, data.train.labels, reference.train_transform())
    epochs = {"ours": 0, "ours_cl": 0}

    def ours(channels_last: bool):
        key = "ours_cl" if channels_last else "ours"

        def once() -> float:
            elapsed, seen = timer(), 0
            for x, _, _ in feeds[channels_last].train_batches(sampler, epochs[key], batch):
                seen += len(x)
            epochs[key] += 1
            return seen / elapsed()
        return once

    def ref() -> float:
        loader = reference.train_loader(ref_set, batch_size=batch, workers=workers)
        elapsed, seen = timer(), 0
        for x, _ in loader:
            seen += len(x)
        return seen / elapsed()

    ours(False)(), ours(True)()  # upload to the (CPU) device once, as the trainer does at its first epoch
    rates = interleave({"ours": ours(False), "ours_channels_last": ours(True), "reference": ref}, rounds)
    stats = {f"{name}_images_per_s": spread(v) for name, v in rates.items()}
    med = {name: stats[f"{name}_images_per_s"]["median"] for name in rates}
    return {
        "train_images": n, "is_cifar10_lt_size": n == CIFAR10_LT_IF100_TRAIN_IMAGES, "batch": batch,
        "reference_workers": workers, "torch_threads": torch.get_num_threads(), "rounds": rounds, **stats,
        "speedup": med["ours"] / med["reference"],
        "speedup_channels_last": med["ours_channels_last"] / med["reference"],
    }
