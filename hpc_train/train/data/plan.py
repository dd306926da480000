"""An in-memory epoch planned up front: every step's batch as one row of a table on the device.

The epoch's sample order and every augmentation draw are made on the CPU (:func:`host_tables`, from the same
per-step generators as always; the trainer makes the next epoch's while the GPU runs this one) and copied to
the device once (:meth:`EpochPlan.fill`). Step ``s`` of the epoch is row ``s`` of ``full`` while the global batch
is full, and ``last`` for the short last one. A row holds everything the step needs, side by side
(:class:`RowLayout`): this rank's image indices, their augmentation (flip, top and left), their targets, the
targets of the whole global batch (the losses normalise over them), and with mixup the same four for each
image's partner; λ has a table of its own. So a step finds its batch by a position held on the device with one
``index_select`` — what a CUDA graph replays, no host work — where looking up indices, augmentation and two
kinds of targets took five operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from . import mixup
from .samplers import derive_seed

PLAN_TABLES = ("full", "last", "lam", "last_lam")
"""The tensors of a plan: full-batch rows, the last batch's row, and λ of each (mixup only)."""


class Batch(NamedTuple):
    """One step's batch as views of its row (``mix``: the mixup partners' batch, None without mixup)."""

    idx: Tensor
    coords: tuple[Tensor, Tensor, Tensor] | None
    y: Tensor
    y_global: Tensor
    mix: "Batch | None" = None


@dataclass(frozen=True)
class RowLayout:
    """Where each part of a step's batch lies in its row: ``share`` images of this rank in a global batch of
    ``batch``; ``augmented``: their flip, top and left columns (``3 × share``); ``mixing``: the partners too."""

    share: int
    batch: int
    augmented: bool
    mixing: bool

    def _parts(self) -> list[int]:
        one = [self.share] + ([3 * self.share] if self.augmented else []) + [self.share, self.batch]
        return one * (2 if self.mixing else 1)

    @property
    def width(self) -> int:
        return sum(self._parts())

    def split(self, row: Tensor) -> Batch:
        """The batch of a row (views, nothing copied)."""
        parts = list(row.split(self._parts()))

        def one() -> Batch:
            idx = parts.pop(0)
            coords = tuple(parts.pop(0).view(3, self.share).unbind(0)) if self.augmented else None
            return Batch(idx, coords, parts.pop(0), parts.pop(0))  # type: ignore[arg-type]

        first = one()
        return first._replace(mix=one()) if self.mixing else first


def pack(idx: Tensor, coords: Tensor | None, whole: Tensor, labels: Tensor) -> list[Tensor]:
    """The row parts of steps (leading dimension: steps) from this rank's indices ``idx``, their draws ``coords``
    (``steps × share × 3``), the global batch's indices ``whole`` and the split's labels (int64)."""
    steps = len(idx)
    parts = [idx]
    if coords is not None:
        parts.append(coords.transpose(1, 2).reshape(steps, 3 * coords.shape[1]))  # explicit: steps may be 0
    return parts + [labels[idx], labels[whole]]


@dataclass
class HostPlan:
    """An epoch's tables on the CPU (pinned on CUDA) and their layouts: what :meth:`EpochPlan.fill` copies."""

    steps: int
    full_steps: int
    layout: RowLayout
    last_layout: RowLayout | None
    tables: dict[str, Tensor | None]


@dataclass
class EpochPlan:
    """One epoch of one rank's training batches on the device (module docstring); refilled in place every epoch
    while the shapes stay (a captured step keeps reading the same addresses)."""

    steps: int
    """Global steps of the epoch (the last may be short)."""
    full_steps: int
    layout: RowLayout
    last_layout: RowLayout | None
    full: Tensor
    """``(full_steps, layout.width)`` int64: the rows of the full global batches."""
    last: Tensor | None = None
    """``(last_layout.width,)`` int64: the short last batch's row."""
    lam: Tensor | None = None
    """``(full_steps,)`` float32: mixup's λ of each full global batch."""
    last_lam: Tensor | None = None

    @classmethod
    def allocate(cls, host: HostPlan, device: torch.device) -> "EpochPlan":
        tables = {k: None if v is None else torch.empty_like(v, device=device) for k, v in host.tables.items()}
        return cls(steps=host.steps, full_steps=host.full_steps, layout=host.layout, last_layout=host.last_layout,
                   **tables)

    def fits(self, host: HostPlan) -> bool:
        """``host`` has this plan's layouts and shapes (so it can be copied in place)."""
        def same(a: Tensor | None, b: Tensor | None) -> bool:
            return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape)

        return ((self.layout, self.last_layout, self.steps) == (host.layout, host.last_layout, host.steps)
                and all(same(getattr(self, k), host.tables.get(k)) for k in PLAN_TABLES))

    def fill(self, host: HostPlan) -> None:
        """Copy ``host``'s tables in, queued behind the steps already launched (they still read the old ones)."""
        for key, value in host.tables.items():
            if value is not None:
                getattr(self, key).copy_(value, non_blocking=True)

    @property
    def mixing(self) -> bool:
        return self.layout.mixing

    def row(self, kind: str, pos: Tensor) -> Batch:
        """The batch of the step at the device position ``pos``: a row of the full-batch table (``kind``
        "full", one ``index_select``) or the short last batch ("last")."""
        if kind == "full":
            return self.layout.split(self.full.index_select(0, pos).view(-1))
        assert self.last is not None and self.last_layout is not None
        return self.last_layout.split(self.last)

    def lam_at(self, kind: str, pos: Tensor) -> Tensor:
        """Mixup's λ of the step at ``pos`` (0-dim)."""
        table = self.lam if kind == "full" else self.last_lam
        assert table is not None
        return (table.index_select(0, pos) if kind == "full" else table).view(())

    def rows(self, step: int) -> Batch:
        """The batch of ``step``, indexed on the host (the eager one-batch-at-a-time path)."""
        if step < self.full_steps:
            return self.layout.split(self.full[step])
        assert self.last is not None and self.last_layout is not None
        return self.last_layout.split(self.last)


def host_tables(seq: Tensor, labels: Tensor, draw, *, augmented: bool, batch_size: int, rank: int,
                world_size: int, mixup_alpha: float = 0.0, seed: int = 0, epoch: int = 0) -> HostPlan:
    """The tables of an epoch of sample order ``seq`` (this rank's share of every global batch), ``draw(step,
    size)`` giving a batch's augmentation (``size × 3``; None when not ``augmented``); with mixup partners when
    ``mixup_alpha`` (:mod:`.mixup`, drawn from ``seed`` and ``epoch``)."""
    n, b, w, r = len(seq), batch_size, world_size, rank
    full = n // b
    labels = labels.long()
    whole = seq[:full * b].view(full, b)
    draws = [draw(step, b) for step in range(full)]
    coords = None if not augmented else (
        torch.stack([d[r::w] for d in draws]) if draws else torch.zeros(0, b // w, 3, dtype=torch.int64))
    mine = whole[:, r::w]
    parts = pack(mine, coords, whole, labels)
    last_parts, last_layout, last_draw, last = None, None, None, seq[full * b:]
    if len(last):
        last_draw = draw(full, len(last))
        last_parts = pack(last[r::w][None], None if last_draw is None else last_draw[r::w][None], last[None], labels)
        last_layout = RowLayout(len(last[r::w]), len(last), augmented, bool(mixup_alpha))
    tables: dict[str, Tensor | None] = {"lam": None, "last_lam": None}
    if mixup_alpha:
        lams, partners = [], []
        for step in range(full):
            lam, perm = mixup.draw(mixup_alpha, seed, epoch, step, b)
            partners.append(mixup.partner_tables(whole[step], draws[step], perm, r, w))
            lams.append(lam)
        parts += _stacked(partners, b // w, b, augmented, labels)
        tables["lam"] = torch.tensor(lams, dtype=torch.float32)
        if last_parts is not None:
            lam, perm = mixup.draw(mixup_alpha, seed, epoch, full, len(last))
            last_parts += _stacked([mixup.partner_tables(last, last_draw, perm, r, w)], len(last[r::w]), len(last),
                                   augmented, labels)
            tables["last_lam"] = torch.tensor([lam], dtype=torch.float32)
    tables["full"] = torch.cat(parts, 1)
    tables["last"] = None if last_parts is None else torch.cat(last_parts, 1)[0]
    layout = RowLayout(b // w, b, augmented, bool(mixup_alpha))
    return HostPlan(steps=-(-n // b), full_steps=full, layout=layout, last_layout=last_layout, tables=tables)


def _stacked(partners: Sequence[tuple[Tensor, Tensor, Tensor | None]], share: int, batch: int, augmented: bool,
             labels: Tensor) -> list[Tensor]:
    """The row parts of the mixup partners of several steps (each: their indices, the permuted batch, their
    draws)."""
    if not partners:
        empty = torch.zeros(0, share, dtype=torch.int64)
        return pack(empty, torch.zeros(0, share, 3, dtype=torch.int64) if augmented else None,
                    torch.zeros(0, batch, dtype=torch.int64), labels)
    idx, whole, coords = (torch.stack(list(col)) if col[0] is not None else None for col in zip(*partners))
    return pack(idx, coords, whole, labels)


def augment_draw(images, seed: int, epoch: int):
    """``draw(step, size)`` of :func:`host_tables` for ``images`` (a :class:`~.pipeline.DeviceImages`): every
    global batch's augmentation from its own generator, keyed by (seed, epoch, step)."""
    def draw(step: int, size: int) -> Tensor | None:
        # The trailing 0 is where the rank went: world size 1 keeps the draws it always had.
        return images.draw(size, torch.Generator().manual_seed(derive_seed("augment", seed, epoch, step, 0)))

    return draw
