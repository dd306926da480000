"""Batches: small sets live on the device, large ones stream through DataLoader workers.

In-memory sets (CIFAR, digits, synthetic) are uploaded once as uint8 ``N×C×H×W`` (a quarter of the
bytes of float32, and uint8 gathers are cheap); each step gathers its indices on the device and applies
random crop (zero padding, as torchvision's ``RandomCrop(padding=p)``), horizontal flip and
normalisation to the whole batch at once — the airbench pattern, no per-image Python.

Augmentation is keyed by (seed, epoch, step) and the position in the *global* batch, never by rank:
every rank draws the whole global batch's crops and flips on the CPU from one generator and keeps its
own positions (``[rank::world_size]``), so an image gets the same augmentation at any world size, and an
epoch resumed mid-way (at any world size, on any device) sees exactly the augmentations it would have
seen. At world size 1 the draws are those of the rank-keyed scheme before it (rank 0).

An epoch of an in-memory set is planned up front (:class:`EpochPlan`): its indices and augmentation
draws are made on the CPU and copied to the device once, and the trainer's step reads its row by a
position held on the device — no host-to-device copy and no host work per step.

On-disk sets (list files, ImageFolder) use a DataLoader per split with our batch sampler, pinned
memory on CUDA and persistent workers (:mod:`.file_batches`); augmentation is torchvision's
RandomResizedCrop + flip (+ color jitter), run under a per-sample seed drawn the same way.

Every training batch comes with the targets of its whole global batch: the losses normalise over them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.utils.data
from torch import Tensor

from ...config import TrainConfig
from .datasets import ArraySplit, DataSource
from . import mixup
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
    """An in-memory split on the device, with batched augmentation.

    For training the split is zero-padded once, at upload, stored in both orientations (as is and
    mirrored) and viewed (``as_strided``, no copy) as ``N × 2 × (2p+1) × (2p+1) × C × H × W``: every
    image, flipped or not, at every crop offset. A batch of random crops and flips is then one gather,
    ``windows[idx, flip, top, left]``, instead of per-pixel index arithmetic plus a masked flip (about
    50× faster on a CPU for 128 CIFAR images than the per-pixel indexing it replaced; BENCHMARKS.md).
    The cost is memory: 2 × (1 + 2p/H)² of the uint8 bytes (3.1× for CIFAR: 119 MB for CIFAR-10-LT's
    12,406 training images, 480 MB for all 50,000), training split only; without flips one orientation.
    """

    def __init__(self, split: ArraySplit, device: torch.device, *, mean: tuple[float, ...], std: tuple[float, ...],
                 crop_padding: int, flip: bool, channels_last: bool) -> None:
        self.device = device
        images = torch.from_numpy(split.images)
        n, c, h, w = images.shape
        p = crop_padding
        self.windows: Tensor | None = None
        if p > 0 or flip:
            padded = torch.nn.functional.pad(images, (p, p, p, p))  # zeros, as RandomCrop(padding=p)
            both = torch.stack([padded, padded.flip(3)], 1) if flip else padded.unsqueeze(1)
            both = both.to(device)
            sn, sf, sc, sh, sw = both.stride()
            self.windows = both.as_strided((n, both.shape[1], 2 * p + 1, 2 * p + 1, c, h, w),
                                           (sn, sf, sh, sw, sc, sh, sw))
            self.images = both[:, 0, :, p:p + h, p:p + w]  # the unpadded images, a view of the same memory
        else:
            self.images = images.to(device)
        self.labels = torch.from_numpy(split.labels).to(device)
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)
        self.crop_padding, self.flip, self.channels_last = crop_padding, flip, channels_last

    def __len__(self) -> int:
        return len(self.labels)

    def _normalise(self, x: Tensor) -> Tensor:
        # torchvision's ToTensor + Normalize, operation for operation (so the result is bit-identical),
        # in place on the one float copy.
        x = x.float().div_(255.0).sub_(self.mean).div_(self.std)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

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

    def apply(self, idx: Tensor, coords: Tensor | None) -> tuple[Tensor, Tensor]:
        """The augmented, normalised batch of ``idx`` given its :meth:`draw` (both on this device)."""
        with _one_cpu_thread(self.device):
            if coords is None:
                x = self.images[idx]
            else:
                x = self.windows[idx, coords[:, 0], coords[:, 1], coords[:, 2]]  # (b, C, H, W)
            return self._normalise(x), self.labels[idx]

    def augmented(self, idx: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        coords = self.draw(len(idx), gen)
        return self.apply(idx.to(self.device, non_blocking=True),
                          None if coords is None else coords.to(self.device, non_blocking=True))

    def plain(self, idx: Tensor | slice) -> tuple[Tensor, Tensor]:
        """Normalised images of ``idx``: an index tensor, or a slice (a view: nothing to copy to the device)."""
        with _one_cpu_thread(self.device):
            if isinstance(idx, Tensor):
                idx = idx.to(self.device, non_blocking=True)
            return self._normalise(self.images[idx]), self.labels[idx]


@dataclass
class EpochPlan:
    """One epoch of one rank's training batches as index tables on the device. Step ``s`` of the epoch
    is row ``s`` of ``idx`` / ``whole`` / ``coords`` while the global batch is full, and the ``last_*``
    tensors for the short last one, so a step finds its batch by a position held on the device and
    needs nothing from the host — what a CUDA graph replays. :meth:`Feed.epoch_plan` refills the same
    tensors every epoch."""

    steps: int
    """Global steps of the epoch (the last may be short)."""
    full_steps: int
    idx: Tensor
    """``(full_steps, B / W)`` this rank's image indices of each full global batch."""
    whole: Tensor
    """``(full_steps, B)`` the global batch's image indices (the losses normalise over its targets)."""
    coords: Tensor | None
    """``(full_steps, B / W, 3)`` augmentation windows (flip, top, left); None without augmentation."""
    last_idx: Tensor | None = None
    last_whole: Tensor | None = None
    last_coords: Tensor | None = None
    mix_idx: Tensor | None = None
    """Mixup (:mod:`.mixup`): ``(full_steps, B / W)`` the image indices of this rank's partners; None without."""
    mix_whole: Tensor | None = None
    """``(full_steps, B)`` the permuted global batch's image indices."""
    mix_coords: Tensor | None = None
    mix_lam: Tensor | None = None
    """``(full_steps,)`` float32: λ of each full global batch."""
    last_mix_idx: Tensor | None = None
    last_mix_whole: Tensor | None = None
    last_mix_coords: Tensor | None = None
    last_mix_lam: Tensor | None = None

    KEYS = ("idx", "whole", "coords", "last_idx", "last_whole", "last_coords", "mix_idx", "mix_whole", "mix_coords",
            "mix_lam", "last_mix_idx", "last_mix_whole", "last_mix_coords", "last_mix_lam")

    def fits(self, host: dict[str, Tensor | None]) -> bool:
        """The tables of ``host`` have this plan's shapes (so they can be copied in place)."""
        def same(a: Tensor | None, b: Tensor | None) -> bool:
            return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape)

        return all(same(getattr(self, k), host.get(k)) for k in self.KEYS)

    @property
    def mixing(self) -> bool:
        return self.mix_lam is not None or self.last_mix_lam is not None

    def row(self, kind: str, pos: Tensor, prefix: str = "") -> tuple[Tensor, Tensor, Tensor | None]:
        """(idx, whole, coords) of the step at the device position ``pos``: a row of the full-batch tables
        (``kind`` "full") or the short last batch ("last"); ``prefix`` "mix_": its mixup partners'."""
        if kind == "full":
            idx, whole, coords = (getattr(self, prefix + k) for k in ("idx", "whole", "coords"))
            return (idx.index_select(0, pos).view(-1), whole.index_select(0, pos).view(-1),
                    None if coords is None else coords.index_select(0, pos).view(-1, 3))
        last = tuple(getattr(self, f"last_{prefix}{k}") for k in ("idx", "whole", "coords"))
        return last  # type: ignore[return-value]

    def lam(self, kind: str, pos: Tensor) -> Tensor:
        """Mixup's λ of the step at ``pos`` (0-dim)."""
        table = self.mix_lam if kind == "full" else self.last_mix_lam
        assert table is not None
        return (table.index_select(0, pos) if kind == "full" else table).view(())

    def rows(self, step: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """(idx, whole, coords) of ``step``, indexed on the host (the eager one-batch-at-a-time path)."""
        if step < self.full_steps:
            return self.idx[step], self.whole[step], None if self.coords is None else self.coords[step]
        assert self.last_idx is not None and self.last_whole is not None
        return self.last_idx, self.last_whole, self.last_coords


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
                 color_jitter: float = 0.0, mixup_alpha: float = 0.0) -> None:
        self.data, self.device, self.rank, self.world_size, self.seed = data, device, rank, world_size, seed
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
            self._mem[which] = DeviceImages(split, self.device, **aug)
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
        """One batch at a time from the epoch's :class:`EpochPlan` (the trainer's step reads the plan
        itself, by a device-side position)."""
        images = self._device_split("train")
        plan = self.epoch_plan(sampler, epoch, batch_size)
        for step in range(start_step, plan.steps):
            idx, whole, coords = plan.rows(step)
            x, y = images.apply(idx, coords)
            yield x, y, images.labels[whole]

    def train_images(self) -> DeviceImages:
        """The training split on the device (in-memory sets only)."""
        return self._device_split("train")

    def plan_tables(self, sampler: GlobalSampler, epoch: int, batch_size: int,
                    with_mixup: bool = False) -> dict[str, Tensor | None]:
        """The host side of :meth:`epoch_plan`: the epoch's tables on the CPU, made from the same
        per-step generators as always (the trainer makes the next epoch's while the GPU runs this one);
        ``with_mixup``: with the mixup partners of every step (``mixup_alpha``)."""
        images = self._device_split("train")
        seq = sampler.global_sequence(epoch)
        n, b, w, r = len(seq), batch_size, self.world_size, self.rank
        full = n // b

        def draw(step: int, size: int) -> Tensor | None:
            # The trailing 0 is where the rank went: world size 1 keeps the draws it always had.
            return images.draw(size, torch.Generator().manual_seed(derive_seed("augment", self.seed, epoch, step, 0)))

        whole = seq[:full * b].view(full, b)
        draws = [draw(step, b) for step in range(full)]
        host = {"idx": whole[:, r::w].contiguous(), "whole": whole.contiguous(),
                "coords": None if images.windows is None else (
                    torch.stack([d[r::w] for d in draws]) if draws else torch.zeros(0, b // w, 3, dtype=torch.int64))}
        last_draw = None
        if n > full * b:
            last = seq[full * b:]
            last_draw = d = draw(full, len(last))
            host.update(last_idx=last[r::w].contiguous(), last_whole=last.contiguous(),
                        last_coords=None if d is None else d[r::w].contiguous())
        if with_mixup and self.mixup_alpha > 0:
            host.update(self._mixup_tables(epoch, whole, draws, seq[full * b:], last_draw, images.windows is not None))
        if self.device.type == "cuda":
            host = {k: None if v is None else v.pin_memory() for k, v in host.items()}
        return host

    def _mixup_tables(self, epoch: int, whole: Tensor, draws: list[Tensor | None], last: Tensor,
                      last_draw: Tensor | None, augmented: bool) -> dict[str, Tensor | None]:
        """The mixup partners of every global batch of the epoch (:mod:`.mixup`), as plan tables."""
        r, w, b = self.rank, self.world_size, whole.shape[1]
        idx, mixed, coords, lams = [], [], [], []
        for step in range(len(whole)):
            lam, perm = mixup.draw(self.mixup_alpha, self.seed, epoch, step, b)
            i, m, c = mixup.partner_tables(whole[step], draws[step], perm, r, w)
            idx.append(i), mixed.append(m), coords.append(c), lams.append(lam)
        out: dict[str, Tensor | None] = {
            "mix_idx": torch.stack(idx) if idx else torch.zeros(0, b // w, dtype=torch.int64),
            "mix_whole": torch.stack(mixed) if mixed else torch.zeros(0, b, dtype=torch.int64),
            "mix_coords": None if not augmented else (
                torch.stack(coords) if coords else torch.zeros(0, b // w, 3, dtype=torch.int64)),
            "mix_lam": torch.tensor(lams, dtype=torch.float32)}
        if len(last):
            lam, perm = mixup.draw(self.mixup_alpha, self.seed, epoch, len(whole), len(last))
            i, m, c = mixup.partner_tables(last, last_draw, perm, r, w)
            out.update(last_mix_idx=i.contiguous(), last_mix_whole=m.contiguous(),
                       last_mix_coords=None if c is None else c.contiguous(),
                       last_mix_lam=torch.tensor([lam], dtype=torch.float32))
        return out

    def epoch_plan(self, sampler: GlobalSampler, epoch: int, batch_size: int, out: EpochPlan | None = None,
                   tables: dict[str, Tensor | None] | None = None, with_mixup: bool = False) -> EpochPlan:
        """The epoch's batches as index tables on the device (see :class:`EpochPlan`), copied in one go
        from :meth:`plan_tables` (or ``tables``, made earlier); into ``out``'s tensors, in place, when
        their shapes match (a captured step keeps reading the same addresses). The copies are queued
        behind the steps already launched, so those still read the previous epoch's tables."""
        host = tables if tables is not None else self.plan_tables(sampler, epoch, batch_size, with_mixup)
        n, b = sampler.num_samples, batch_size
        plan = out if out is not None and out.fits(host) else EpochPlan(
            steps=-(-n // b), full_steps=n // b,
            **{k: None if v is None else torch.empty_like(v, device=self.device) for k, v in host.items()})
        for key, value in host.items():
            if value is not None:
                getattr(plan, key).copy_(value, non_blocking=True)
        return plan

    def eval_tensors(self, which: str) -> tuple[Tensor, Tensor]:
        """This rank's unpadded shard of an in-memory split, normalised on the device once and kept: every
        evaluation then only slices it. (Normalising the whole shard runs the same operations as batch by
        batch, so the values are bit-identical.)"""
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
