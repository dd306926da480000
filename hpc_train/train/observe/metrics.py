"""Exact distributed evaluation and the many / medium / few report.

Each rank counts per-class ``[correct, count]`` on its unpadded shard of the evaluation split and the
counts are summed with one all-reduce, so world sizes 1, 2 and 3 give identical per-class accuracy.
(``DistributedSampler`` pads the split with duplicates, and averaging per-rank accuracies is a mean of
means — both are wrong for small tail classes.)

Groups follow facebookresearch/classifier-balancing's ``shot_acc``: **many** > 100 training images,
**few** < 20, **medium** otherwise — a class with exactly 100 or exactly 20 images is medium. Group
accuracy is the mean of its classes' accuracies. All accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

MANY_ABOVE = 100
"""A class is many-shot when it has more than this many training images."""
FEW_BELOW = 20
"""A class is few-shot when it has fewer than this many training images."""
GROUPS = ("many", "medium", "few")
ECE_BINS = 15
"""Bins of the expected calibration error (MiSLAS reports it with 15)."""


def shot_group(train_count: int) -> str:
    if train_count > MANY_ABOVE:
        return "many"
    if train_count < FEW_BELOW:
        return "few"
    return "medium"


def group_sizes(train_counts: Sequence[int]) -> dict[str, int]:
    groups = [shot_group(int(n)) for n in train_counts]
    return {g: groups.count(g) for g in GROUPS}


def summarize(correct: Sequence[int], count: Sequence[int], train_counts: Sequence[int]) -> dict[str, Any]:
    """Top-1, balanced accuracy (mean over classes that have evaluation images), many / medium / few
    and per-class accuracy (None for a class without evaluation images)."""
    correct_a, count_a = np.asarray(correct, dtype=np.int64), np.asarray(count, dtype=np.int64)
    per_class = [float(c / n) if n > 0 else None for c, n in zip(correct_a, count_a)]
    present = [a for a in per_class if a is not None]
    out: dict[str, Any] = {
        "top1": float(correct_a.sum() / count_a.sum()) if count_a.sum() else None,
        "balanced": float(np.mean(present)) if present else None,
    }
    for group in GROUPS:
        accs = [a for a, n in zip(per_class, train_counts) if a is not None and shot_group(int(n)) == group]
        out[group] = float(np.mean(accs)) if accs else None
    out["per_class"] = per_class
    out["correct"] = correct_a.tolist()
    out["count"] = count_a.tolist()
    return out


def expected_calibration_error(count: Sequence[int], correct: Sequence[int],
                               confidence: Sequence[float]) -> float | None:
    """Σ_b |correct_b - confidence_b| / N from per-bin image counts, correct predictions and summed top
    probabilities: MiSLAS's Σ_b |acc_b - conf_b|·n_b / Σ_b n_b (``utils/metric.py``, ``calibration``)."""
    total = sum(count)
    if not total:
        return None
    return float(sum(abs(c - p) for c, p in zip(correct, confidence)) / total)


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{100 * value:6.2f}"


def format_table(results: dict[str, dict[str, Any]], train_counts: Sequence[int]) -> str:
    """The end-of-run table: one row per result (e.g. best, last), columns top-1 / balanced / groups."""
    sizes = group_sizes(train_counts)
    w = max([14, *(len(label) for label in results)])
    head = (f"{'':{w}s} {'top-1':>6s} {'bal.':>6s} {'many':>6s} {'medium':>6s} {'few':>6s}\n"
            f"{'(classes)':{w}s} {'':>6s} {'':>6s} {sizes['many']:>6d} {sizes['medium']:>6d} {sizes['few']:>6d}")
    rows = [f"{label:{w}s} {_pct(r.get('top1'))} {_pct(r.get('balanced'))} {_pct(r.get('many'))} "
            f"{_pct(r.get('medium'))} {_pct(r.get('few'))}" for label, r in results.items()]
    rule = "-" * (w + 36)
    return "\n".join([rule, head, rule, *rows, rule])


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")


def plot_per_class(path: Path, per_class: Sequence[float | None], train_counts: Sequence[int], title: str) -> bool:
    """PNG of per-class accuracy against training count (log x; the groups shaded and named, a legend, ``title``
    saying which epoch: :mod:`hpc_train.runs.plots`); False when matplotlib is missing."""
    from ...runs import plots

    try:
        figure = plots.per_class_figure(per_class, [int(n) for n in train_counts], title)
    except ImportError:
        return False
    plots.save(figure, path)
    return True
