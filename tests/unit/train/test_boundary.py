"""The epoch boundary's checkpoint clock (hpc_train/train/loop/boundary.py): when a periodic checkpoint is due, and
that a checkpoint is never written twice for one step."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the boundary module lives in the trainer, which imports torch

from hpc_train.train.loop.boundary import CheckpointClock  # noqa: E402


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


def test_a_time_based_checkpoint_is_asked_for_once_when_its_time_has_come():
    now = Clock()
    clock = CheckpointClock(every_s=60, every_epochs=1, now=now)
    now.s += 59
    assert clock.ask() is False
    now.s += 1
    assert clock.ask() is True
    now.s += 600
    assert clock.ask() is False  # asked already: the ranks act on the agreed flag, nobody asks twice
    clock.written(global_step=40)
    now.s += 30
    assert clock.ask() is False  # the time counts from the checkpoint, not from the start
    now.s += 30
    assert clock.ask() is True


def test_the_epoch_end_follows_the_agreed_flag_by_time_and_the_epoch_count_otherwise():
    by_time = CheckpointClock(every_s=60, every_epochs=3, now=Clock())
    assert [by_time.due_at_epoch_end(e, agreed_due=d) for e, d in ((3, False), (4, True))] == [False, True]
    by_epochs = CheckpointClock(every_s=None, every_epochs=3, now=Clock())
    assert by_epochs.ask() is False  # no time-based checkpoints at all
    assert [by_epochs.due_at_epoch_end(e, agreed_due=True) for e in (1, 2, 3, 6)] == [False, False, True, True]


def test_a_step_already_written_or_resumed_from_is_not_written_again():
    now = Clock()
    clock = CheckpointClock(every_s=60, every_epochs=1, now=now)
    assert not clock.holds(0)  # nothing written yet: step 0 is not on disk
    clock.written(global_step=12)
    assert clock.holds(12) and not clock.holds(13)
    now.s += 100
    clock.resumed_at(global_step=30)
    assert clock.holds(30) and not clock.holds(12)
    assert clock.ask() is True  # resuming does not restart the time: the last write was 100 s ago
