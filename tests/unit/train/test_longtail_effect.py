"""On real long-tailed data, balanced softmax must beat cross-entropy on balanced accuracy.

The criterion was fixed before this configuration was ever run: over seeds 0, 1, 2, balanced softmax
wins on every seed and by at least 3.0 percentage points of balanced accuracy on the mean. (Before
writing it, we had only seen the demo job — 30 epochs at imbalance 20 and 100 — where balanced softmax
led by about 4 and 15 points; this test uses a different, shorter configuration: 15 epochs at
imbalance 50.) The test split is the balanced 50-per-class hold-out of the real digits.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hpc_train.train import launch  # noqa: E402

from .helpers import make_spec  # noqa: E402

SEEDS = (0, 1, 2)
MARGIN_POINTS = 3.0


def _balanced_accuracy(loss: str, seed: int, tmp_path) -> float:
    spec = make_spec({
        "seed": seed, "epochs": 15, "batch_size": 64, "log_every_steps": 1000, "eval_every_epochs": 15,
        "data": {"name": "digits-lt", "imbalance_factor": 50},
        "model": {"name": "small_cnn"}, "loss": {"name": loss},
        "optim": {"lr": 0.05, "weight_decay": 5e-4}, "schedule": {"name": "cosine", "warmup_epochs": 1},
    }, tasks=1)
    outcome = launch.run(spec, run_dir=str(tmp_path / f"{loss}-{seed}"))
    assert outcome.exit_code == 0
    return 100 * outcome.summary["last"]["balanced"]


def test_balanced_softmax_beats_cross_entropy_on_digits_lt(tmp_path):
    ce = {s: _balanced_accuracy("ce", s, tmp_path) for s in SEEDS}
    bs = {s: _balanced_accuracy("balanced_softmax", s, tmp_path) for s in SEEDS}
    report = ", ".join(f"seed {s}: BS {bs[s]:.1f} vs CE {ce[s]:.1f}" for s in SEEDS)
    assert all(bs[s] > ce[s] for s in SEEDS), report
    mean_gain = sum(bs[s] - ce[s] for s in SEEDS) / len(SEEDS)
    assert mean_gain >= MARGIN_POINTS, report
    print(report, f"mean gain {mean_gain:.1f} points")
