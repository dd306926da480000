"""``--epochs N``: a recipe shortened (or lengthened) in proportion, every epoch-indexed key with it.

A recipe's warm-up, milestones and DRW epoch are absolute epoch numbers, so ``--set train.epochs=3``
alone leaves them outside the run (and validation refuses it). ``rescale`` maps each key from the
recipe's E epochs to N: x → floor(x · N / E + 1/2) (round half up), then

* epoch indices (``loss.drw_epoch``, ``schedule.milestones``) are clamped into [0, N - 1]: they stay
  inside the run and keep their order (two milestones may land on the same epoch; their factors then
  apply together);
* lengths (``schedule.warmup_epochs``, ``sampler.progressive_epochs``, ``two_stage.crt_epochs``) that
  were not 0 stay at least 1, so a stage or a warm-up is shortened, never dropped; the warm-up also
  stays below N, as validation requires.

Intervals (``eval_every_epochs``, ``checkpoint_every_epochs``) are left alone: the run evaluates and
checkpoints after its last epoch anyway. Torch-free, for ``train``, ``submit`` and ``render`` alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .job import JobSpec
from .typed import MAX_INT
from .validate import validate


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any


def _scaled(x: int, old_epochs: int, new_epochs: int) -> int:
    return (2 * x * new_epochs + old_epochs) // (2 * old_epochs)  # floor(x * N / E + 1/2), in integers


def rescale(spec: JobSpec, epochs: int) -> tuple[JobSpec, list[Change]]:
    """``spec`` with ``train.epochs = epochs`` and every epoch-indexed key scaled (see the module
    docstring); the changes, in key order. Raises ConfigError for ``epochs < 1``."""
    if epochs < 1:
        raise ConfigError(f"--epochs must be at least 1, got {epochs}")
    t = spec.train
    old = t.epochs

    def index(x: int) -> int:
        return min(epochs - 1, _scaled(x, old, epochs))

    def length(x: int, limit: int | None = None) -> int:
        y = max(1, _scaled(x, old, epochs)) if x > 0 else 0
        return min(y, limit) if limit is not None else y

    schedule = dataclasses.replace(t.schedule, warmup_epochs=length(t.schedule.warmup_epochs, epochs - 1),
                                   milestones=tuple(index(m) for m in t.schedule.milestones))
    loss = dataclasses.replace(t.loss, drw_epoch=None if t.loss.drw_epoch is None else index(t.loss.drw_epoch))
    progressive = t.sampler.progressive_epochs
    sampler = dataclasses.replace(t.sampler, progressive_epochs=None if progressive is None else length(progressive))
    two = dataclasses.replace(t.two_stage, crt_epochs=length(t.two_stage.crt_epochs))
    train = dataclasses.replace(t, epochs=epochs, schedule=schedule, loss=loss, sampler=sampler, two_stage=two)
    pairs = [
        ("train.epochs", old, epochs),
        ("train.schedule.warmup_epochs", t.schedule.warmup_epochs, schedule.warmup_epochs),
        ("train.schedule.milestones", list(t.schedule.milestones), list(schedule.milestones)),
        ("train.loss.drw_epoch", t.loss.drw_epoch, loss.drw_epoch),
        ("train.sampler.progressive_epochs", progressive, sampler.progressive_epochs),
        ("train.two_stage.crt_epochs", t.two_stage.crt_epochs, two.crt_epochs),
    ]
    changes = [Change(k, a, b) for k, a, b in pairs if a != b]
    for change in changes:  # the typed reader caps every integer a file or --set gives; --epochs comes after it
        if max(change.new if isinstance(change.new, list) else [change.new or 0], default=0) > MAX_INT:
            raise ConfigError(f"--epochs {epochs}: {change.key} would be {_show(change.new)}, out of range (at "
                              f"most {MAX_INT:,}); ask for fewer epochs")
    return validate(dataclasses.replace(spec, train=train)), changes


def describe(epochs: int, changes: list[Change]) -> str:
    """One line for stderr: what ``--epochs`` changed."""
    if not changes:
        return f"--epochs {epochs}: nothing to change"
    return f"--epochs {epochs}: " + ", ".join(f"{c.key} {_show(c.old)} -> {_show(c.new)}" for c in changes)


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value)
