"""The epoch's learning rates (hpc_train/train/loop/schedule.py ``EpochRates``): the schedule's values for the
epoch's steps, in the form each optimizer reads them — a device tensor for fused SGD and capturable AdamW, the
host's float for plain AdamW — and the number a progress line and a checkpoint record."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpc_train.config import ScheduleConfig  # noqa: E402
from hpc_train.train.loop.schedule import EpochRates, LrSchedule  # noqa: E402

CPU = torch.device("cpu")
STEPS = 4


def _multistep() -> LrSchedule:
    """0.1 warmed up over 2 epochs, x0.1 from epoch 3: the epochs' rates differ."""
    return LrSchedule(ScheduleConfig(name="multistep", warmup_epochs=2, milestones=(3,), gamma=0.1), 0.1, 5)


def _cosine(base_lr: float = 0.3) -> LrSchedule:
    return LrSchedule(ScheduleConfig(name="cosine", warmup_epochs=0, milestones=()), base_lr, 2)


def test_an_epochs_rates_are_the_schedules_values_for_its_steps_counted_from_the_phase_start():
    rates = EpochRates(CPU)
    schedule = _cosine()
    rates.start_phase(schedule, first_epoch=10)  # stage 2 starting at the run's epoch 10
    assert float(rates.tensor) == pytest.approx(0.3)  # before any epoch: the base rate an optimizer is built with
    rates.start_epoch(11, STEPS, start_step=0)  # the phase's second epoch
    assert [rates.took(s) for s in range(STEPS)] == [schedule.lr(1, s, STEPS) for s in range(STEPS)]
    assert len({rates.took(s) for s in range(STEPS)}) == STEPS  # per-step cosine: not one rate repeated


def test_a_tensor_lr_optimizer_reads_the_rate_at_the_steps_device_position():
    rates = EpochRates(CPU)
    schedule = _cosine()
    rates.start_phase(schedule, first_epoch=0)
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=rates.tensor, fused=True)
    rates.start_epoch(0, STEPS, start_step=0)
    position = torch.zeros(1, dtype=torch.int64)
    for step in range(STEPS):
        rates.load(optimizer, position)
        assert optimizer.param_groups[0]["lr"] is rates.tensor  # the same tensor, updated in place
        expected = torch.tensor(schedule.lr(0, step, STEPS), dtype=torch.float32)
        assert torch.equal(rates.tensor, expected), step  # float32, as the optimizer rounds it
        position.add_(1)


def test_a_float_lr_optimizer_takes_the_host_rates_in_order_from_the_start_step():
    rates = EpochRates(CPU)
    schedule = _cosine()  # per step: every step's rate differs, so a rate taken out of turn shows
    rates.start_phase(schedule, first_epoch=0)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=float(rates.tensor))
    unused = torch.zeros(1, dtype=torch.int64)  # the device position: not read on this path (no host sync)
    for epoch in (0, 1):
        rates.start_epoch(epoch, STEPS, start_step=1)  # a resume in the epoch's second step
        taken = []
        for _ in range(1, STEPS):
            rates.load(optimizer, unused)
            taken.append(optimizer.param_groups[0]["lr"])
        assert taken == [schedule.lr(epoch, s, STEPS) for s in range(1, STEPS)], epoch  # the host's floats


def test_a_checkpoint_records_the_last_rate_taken_or_the_base_rate_before_any_step():
    rates = EpochRates(CPU)
    rates.start_phase(_multistep(), first_epoch=0)
    assert rates.checkpoint_lr() == 0.1
    rates.start_epoch(0, STEPS, start_step=0)
    assert rates.took(0) == pytest.approx(0.05) and rates.checkpoint_lr() == pytest.approx(0.05)
    rates.start_epoch(3, STEPS, start_step=0)
    rates.took(2)
    assert rates.checkpoint_lr() == pytest.approx(0.01)
