"""Batches: small sets live on the device, large ones stream through DataLoader workers.

In-memory sets (CIFAR, digits, synthetic) are uploaded once and normalised on the device once, padded
for random crops (zero padding, as torchvision's ``RandomCrop(padding=p)``) and stored mirrored too
(:class:`DeviceImages`); each step's random crops, flips and normalised pixels are then one gather of the
whole batch — the airbench pattern, no per-image Python and no per-step arithmetic on the data.

Augmentation is keyed by (seed, epoch, step) and the position in the *global* batch, never by rank:
every rank draws the whole global batch's crops and flips on the CPU from one generator and keeps its
own positions (``[rank::world_size]``), so an image gets the same augmentation at any world size, and an
epoch resumed mid-way (at any world size, on any device) sees exactly the augmentations it would have
seen. At world size 1 the draws are those of the rank-keyed scheme before it (rank 0).

An epoch of an in-memory set is planned up front (:mod:`.plan`): its indices, augmentation draws and
targets are made on the CPU and copied to the device once, and the trainer's step reads its row by a
position held on the device — no host-to-device copy and no host work per step.

On-disk sets (list files, ImageFolder) use a DataLoader per split with our batch sampler, pinned
memory on CUDA and persistent workers (:mod:`.file_batches`); augmentation is torchvision's
RandomResizedCrop + flip (+ color jitter), run under a per-sample seed drawn the same way.

Every training batch comes with the targets of its whole global batch: the losses normalise over them.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
import torch.utils.data
from torch import Tensor

from ...config import TrainConfig
from .datasets import ArraySplit, DataSource
from . import plan
from .plan import EpochPlan, HostPlan
from .file_batches import FileImages, _CollateOrEmpty, _IndexBatches, _ShardBatches, _transforms
from .samplers import GlobalSampler, derive_seed, eval_shard

TrainBatch = tuple[Tensor, Tensor, Tensor]
"""(images, targets) of this rank's share, and the targets of the whole global batch."""


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Run a batch's augmentation ops on one CPU thread. They are ~1 ms for 128 CIFAR images either
    way, but each op on several OpenMP threads waits for all of them to be scheduled: on a busy node a
    batch took 10-50 ms that way (BENCHMARKS.md). Switching the count costs about a microsecond."""
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class DeviceImages:
    """An in-memory split on the device, normalised once, with batched augmentation.

    The split is uploaded as uint8 and normalised on the device once, at upload — torchvision's ToTensor +
    Normalize operation for operation, so every pixel is bit for bit what normalising each batch gave — and
    kept in ``dtype`` (float32; the AMP dtype where the first layer would cast to it anyway: the same rounding,
    done once) and, with ``channels_last``, in NHWC order, so a batch is one gather in the model's layout.
    For training the split is zero-padded first (in uint8: the padding normalises like black pixels, as
    RandomCrop's zeros did), stored in both orientations (as is and mirrored) and viewed (``as_strided``, no
    copy) as ``N × 2 × (2p+1) × (2p+1) × C × H × W``: every image, flipped or not, at every crop offset. A
    batch of random crops and flips is then one gather, ``windows[idx, flip, top, left]`` (about 50× faster on
    a CPU for 128 CIFAR images than the per-pixel indexing it replaced; BENCHMARKS.md). The cost is memory:
    2 × (1 + 2p/H)² of the image bytes (3.1× for CIFAR), times 4 in float32 or 2 in bf16: 476 MB (bf16 238 MB)
    for CIFAR-10-LT's 12,406 training images, 1.9 GB for all 50,000; training split only; without flips one
    orientation.
    """

    NORMALISE_CHUNK = 4096
    """Images normalised at a time at upload (bounds the float32 scratch)."""

    def __init__(self, split: ArraySplit, device: torch.device, *, mean: tuple[float, ...], std: tuple[float, ...],
                 crop_padding: int, flip: bool, channels_last: bool, dtype: torch.dtype = torch.float32) -> None:
        self.device, self.dtype = device, dtype
        images = torch.from_numpy(split.images)
        n, c, h, w = images.shape
        p = crop_padding
        self.crop_padding, self.flip, self.channels_last = crop_padding, flip, channels_last
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)
        self.windows: Tensor | None = None
        if p > 0 or flip:
            padded = torch.nn.functional.pad(images, (p, p, p, p))  # zeros, as RandomCrop(padding=p)
            both = torch.stack([padded, padded.flip(3)], 1) if flip else padded.unsqueeze(1)
            stored = self._normalised(both)  # N × F × C × H' × W' (NHWC strides with channels_last)
            sn, sf, sc, sh, sw = stored.stride()
            self.windows = stored.as_strided((n, stored.shape[1], 2 * p + 1, 2 * p + 1, c, h, w),
                                             (sn, sf, sh, sw, sc, sh, sw))
            self.images = stored[:, 0, :, p:p + h, p:p + w]  # the unpadded images, a view of the same memory
        else:
            self.images = self._normalised(images.unsqueeze(1))[:, 0]
        self.labels = torch.from_numpy(split.labels).to(device)

    def __len__(self) -> int:
        return len(self.labels)

    def _normalised(self, uint8: Tensor) -> Tensor:
        """``N × F × C × H × W`` uint8 images normalised on the device into one tensor of ``dtype``."""
        n, f, c, h, w = uint8.shape
        shape = (n, f, h, w, c) if self.channels_last else (n, f, c, h, w)
        out = torch.empty(shape, dtype=self.dtype, device=self.device)
        out = out.permute(0, 1, 4, 2, 3) if self.channels_last else out  # the logical N × F × C × H × W
        mean, std = self.mean.view(1, 1, -1, 1, 1), self.std.view(1, 1, -1, 1, 1)
        for start in range(0, n, self.NORMALISE_CHUNK):
            chunk = uint8[start:start + self.NORMALISE_CHUNK].to(self.device)
            # torchvision's ToTensor + Normalize, operation for operation (the result is bit-identical to
            # normalising batch by batch): in place on one float32 copy, then cast and laid out as stored.
            out[start:start + len(chunk)].copy_(chunk.float().div_(255.0).sub_(mean).div_(std))
        return out

    def draw(self, b: int, gen: torch.Generator) -> Tensor | None:
        """A batch's augmentation as window coordinates ``(b, 3)``: flip, top, left — from the CPU
        generator, crop offsets first and flips second (torchvision's order: crop, then flip the crop),
        so a resumed run sees the same augmentations on any device. None without augmentation."""
        if self.windows is None:
            return None
        p = self.crop_padding
        offsets = torch.randint(0, 2 * p + 1, (b, 2), generator=gen) if p > 0 else torch.zeros(b, 2, dtype=torch.int64)
        flips = (torch.rand(b, generator=gen) < 0.5).long() if self.flip else torch.zeros(b, dtype=torch.int64)
        # Cropping at `left` and then mirroring is the mirrored padded image cropped at 2p - left.
        left = torch.where(flips.bool(), 2 * p - offsets[:, 1], offsets[:, 1])
        return torch.stack([flips, offsets[:, 0], left], 1)

    def gather(self, idx: Tensor, coords: Sequence[Tensor] | None) -> Tensor:
        """The augmented, normalised images of ``idx`` (on this device): one gather, given the flip, top and left
        columns of their :meth:`draw` (None without augmentation)."""
        with _one_cpu_thread(self.device):
            if coords is None:
                x = self.images[idx]
            else:
                flip, top, left = coords
                x = self.windows[idx, flip, top, left]  # (b, C, H, W), in the stored layout
            # A no-op when the gather kept the stored NHWC layout (it does: no copy is counted)
            return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def apply(self, idx: Tensor, coords: Tensor | None) -> tuple[Tensor, Tensor]:
        """The augmented, normalised batch of ``idx`` and its labels, given its :meth:`draw` (both on this
        device)."""
        return self.gather(idx, None if coords is None else coords.unbind(1)), self.labels[idx]

    def augmented(self, idx: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        coords = self.draw(len(idx), gen)
        return self.apply(idx.to(self.device, non_blocking=True),
                          None if coords is None else coords.to(self.device, non_blocking=True))

    def plain(self, idx: Tensor | slice) -> tuple[Tensor, Tensor]:
        """Normalised images of ``idx``: an index tensor, or a slice (a view: nothing to copy to the device)."""
        with _one_cpu_thread(self.device):
            if isinstance(idx, Tensor):
                idx = idx.to(self.device, non_blocking=True)
            return self.images[idx], self.labels[idx]


# --------------------------------------------------------------------------------------------------
# What the trainer sees
# --------------------------------------------------------------------------------------------------


def default_crop_padding(cfg: TrainConfig, data: DataSource) -> int:
    if cfg.data.random_crop_padding is not None:
        return cfg.data.random_crop_padding
    return 1 if data.image_size <= 8 else 4


def default_flip(cfg: TrainConfig, data: DataSource) -> bool:
    return cfg.data.random_flip if cfg.data.random_flip is not None else data.name != "digits-lt"


class Feed:
    """Training batches of one rank for one epoch, and evaluation batches of one rank's unpadded shard."""

    def __init__(self, data: DataSource, device: torch.device, *, rank: int, world_size: int, seed: int,
                 crop_padding: int, flip: bool, channels_last: bool, num_workers: int,
                 color_jitter: float = 0.0, mixup_alpha: float = 0.0, dtype: torch.dtype = torch.float32) -> None:
        self.data, self.device, self.rank, self.world_size, self.seed = data, device, rank, world_size, seed
        self.dtype = dtype
        """What in-memory images are stored in, normalised (the training split in float32 with mixup, which mixes
        them in float32)."""
        self.mixup_alpha = mixup_alpha
        """Mixup of the main stage's in-memory batches (:mod:`.mixup`; 0: off); :meth:`plan_tables` draws it."""
        self.channels_last = channels_last
        self.num_workers = num_workers
        self.color_jitter = color_jitter
        self._mem: dict[str, DeviceImages] = {}
        self._loaders: dict[tuple, torch.utils.data.DataLoader] = {}
        self._eval: dict[str, tuple[Tensor, Tensor]] = {}
        self._aug = dict(mean=data.mean, std=data.std, crop_padding=crop_padding, flip=flip,
                         channels_last=channels_last)

    def _device_split(self, which: str) -> DeviceImages:
        if which not in self._mem:
            split = getattr(self.data, which)
            # Only training batches are augmented: evaluation splits are stored unpadded.
            aug = self._aug if which == "train" else {**self._aug, "crop_padding": 0, "flip": False}
            dtype = torch.float32 if which == "train" and self.mixup_alpha else self.dtype
            self._mem[which] = DeviceImages(split, self.device, dtype=dtype, **aug)
        return self._mem[which]

    def _to_device(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        x = x.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def _loader(self, key: tuple, dataset, batch_sampler, *, persistent: bool,
                collate_fn=None) -> torch.utils.data.DataLoader:
        # Training workers persist across epochs (no re-spawn, warm page cache); evaluation workers are
        # started per evaluation, so a rank does not hold three idle worker pools.
        if key not in self._loaders:
            workers = self.num_workers
            self._loaders[key] = torch.utils.data.DataLoader(
                dataset, batch_sampler=batch_sampler, num_workers=workers,
                pin_memory=self.device.type == "cuda", persistent_workers=persistent and workers > 0,
                prefetch_factor=4 if workers > 0 else None, collate_fn=collate_fn,
                generator=torch.Generator().manual_seed(derive_seed("loader", self.seed, self.rank)),
            )
        return self._loaders[key]

    def train_batches(self, sampler: GlobalSampler, epoch: int, batch_size: int,
                      start_step: int = 0) -> Iterator[TrainBatch]:
        """This rank's share of every global batch (``batch_size`` images) of ``epoch``, with the
        global batch's targets, from ``start_step`` on."""
        if self.data.in_memory:
            yield from self._memory_train_batches(sampler, epoch, batch_size, start_step)
            return
        key = ("train", id(sampler), batch_size)
        if key not in self._loaders:
            batches = _ShardBatches(sampler, self.rank, self.world_size, batch_size, self.seed)
            dataset = FileImages(self.data.train, _transforms(self.data.image_size, self.data.mean, self.data.std,
                                                              True, self.color_jitter))
            self._loader(key, dataset, batches, persistent=True, collate_fn=_CollateOrEmpty(self.data.image_size))
        loader = self._loaders[key]
        loader.batch_sampler.epoch, loader.batch_sampler.start_step = epoch, start_step
        # The epoch's global targets in sequence order, on the device once: each step's are a view.
        epoch_y = torch.from_numpy(self.data.train.labels)[sampler.global_sequence(epoch)]
        pin = self.device.type == "cuda"  # a copy from pageable memory would wait for the GPU's queue first
        epoch_y = (epoch_y.pin_memory() if pin else epoch_y).to(self.device, non_blocking=True)
        for step, (x, y) in enumerate(loader, start_step):
            x, y = self._to_device(x, y)
            yield x, y, epoch_y[step * batch_size:(step + 1) * batch_size]

    def _memory_train_batches(self, sampler: GlobalSampler, epoch: int, batch_size: int,
                              start_step: int) -> Iterator[TrainBatch]:
        """One batch at a time from the epoch's :class:`~.plan.EpochPlan` (the trainer's step reads the plan
        itself, by a device-side position)."""
        images = self._device_split("train")
        epoch_plan = self.epoch_plan(sampler, epoch, batch_size)
        for step in range(start_step, epoch_plan.steps):
            batch = epoch_plan.rows(step)
            yield images.gather(batch.idx, batch.coords), batch.y, batch.y_global

    def train_images(self) -> DeviceImages:
        """The training split on the device (in-memory sets only)."""
        return self._device_split("train")

    def plan_tables(self, sampler: GlobalSampler, epoch: int, batch_size: int, with_mixup: bool = False) -> HostPlan:
        """The host side of :meth:`epoch_plan`: the epoch's tables on the CPU (:func:`~.plan.host_tables`; the
        trainer makes the next epoch's while the GPU runs this one); ``with_mixup``: with the mixup partners of
        every step (``mixup_alpha``)."""
        images = self._device_split("train")
        host = plan.host_tables(sampler.global_sequence(epoch), torch.from_numpy(self.data.train.labels),
                                plan.augment_draw(images, self.seed, epoch), augmented=images.windows is not None,
                                batch_size=batch_size, rank=self.rank, world_size=self.world_size,
                                mixup_alpha=self.mixup_alpha if with_mixup else 0.0, seed=self.seed, epoch=epoch)
        if self.device.type == "cuda":
            host.tables = {k: None if v is None else v.pin_memory() for k, v in host.tables.items()}
        return host

    def epoch_plan(self, sampler: GlobalSampler, epoch: int, batch_size: int, out: EpochPlan | None = None,
                   tables: HostPlan | None = None, with_mixup: bool = False) -> EpochPlan:
        """The epoch's batches as tables on the device (see :mod:`.plan`), copied in one go from
        :meth:`plan_tables` (or ``tables``, made earlier); into ``out``'s tensors, in place, when their shapes
        match (a captured step keeps reading the same addresses). The copies are queued behind the steps
        already launched, so those still read the previous epoch's tables."""
        host = tables if tables is not None else self.plan_tables(sampler, epoch, batch_size, with_mixup)
        target = out if out is not None and out.fits(host) else EpochPlan.allocate(host, self.device)
        target.fill(host)
        return target

    def eval_tensors(self, which: str) -> tuple[Tensor, Tensor]:
        """This rank's unpadded shard of an in-memory split, normalised on the device once and kept in the
        compute dtype: every evaluation then only slices it (at world size 1 a view of the stored split). The
        values are bit for bit those of normalising batch by batch (and of autocast's cast at the first layer)."""
        key = f"eval:{which}"
        if key not in self._eval:
            shard = eval_shard(len(getattr(self.data, which)), self.rank, self.world_size)
            x, y = self._device_split(which).plain(slice(shard.start, shard.stop, shard.step))
            self._eval[key] = (x.contiguous(memory_format=torch.channels_last) if self.channels_last
                               else x.contiguous(), y.contiguous())
        return self._eval[key]

    def eval_batches(self, which: str, batch: int) -> Iterator[tuple[Tensor, Tensor]]:
        split = getattr(self.data, which)
        shard = eval_shard(len(split), self.rank, self.world_size)
        if self.data.in_memory:
            images = self._device_split(which)
            for start in range(0, len(shard), batch):
                r = shard[start: start + batch]
                yield images.plain(slice(r.start, r.stop, r.step))  # a strided view: no index copy
            return
        key = (which, batch)
        if key not in self._loaders:
            dataset = FileImages(split, _transforms(self.data.image_size, self.data.mean, self.data.std, False))
            self._loader(key, dataset, _IndexBatches(shard, batch), persistent=False)
        for x, y in self._loaders[key]:
            yield self._to_device(x, y)
