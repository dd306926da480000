"""The pictures people look at: per-class accuracy against training images, for one run (the trainer writes
``per_class_accuracy.png``) and over a sweep (``report --plot``). Both say what they show — which epoch, which
configurations, the many / medium / few regions (classifier-balancing's groups: many > 100 training images,
few < 20) — and the sweep's shows the spread over seeds, and which configurations it had to leave out.

matplotlib is imported when a picture is drawn (the Agg backend: no display); torch- and numpy-free.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

MANY_ABOVE = 100
"""Many-shot: more training images than this (hpc_train.train.observe.metrics.MANY_ABOVE; a test ties them)."""
FEW_BELOW = 20
"""Few-shot: fewer training images than this (metrics.FEW_BELOW)."""
REGIONS = (("few", f"few (<{FEW_BELOW})", "#f4cccc"), ("medium", "medium", "#fff2cc"),
           ("many", f"many (>{MANY_ABOVE})", "#d9ead3"))


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def group_of(count: int) -> str:
    return "many" if count > MANY_ABOVE else "few" if count < FEW_BELOW else "medium"


def _regions(ax: Any, counts: Sequence[int]) -> None:
    """Shade and name the few / medium / few regions of a log x axis of training images."""
    low, high = max(0.5, min(counts) / 1.5), max(counts) * 1.5
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    edges = {"few": (low, FEW_BELOW), "medium": (FEW_BELOW, MANY_ABOVE), "many": (MANY_ABOVE, high)}
    for group, label, colour in REGIONS:
        left, right = edges[group]
        if right <= low or left >= high:
            continue
        ax.axvspan(max(left, low), min(right, high), color=colour, alpha=0.5, lw=0, zorder=0)
        middle = (max(left, low) * min(right, high)) ** 0.5
        ax.text(middle, 103, label, ha="center", va="bottom", fontsize=8, color="0.3")
    for edge in (FEW_BELOW, MANY_ABOVE):
        if low < edge < high:
            ax.axvline(edge, color="0.5", ls=":", lw=1, zorder=1)
    ax.set_ylim(-2, 110)
    ax.set_xlabel("training images of the class (log scale)")


def per_class_figure(per_class: Sequence[float | None], counts: Sequence[int], title: str) -> Any:
    """One run's per-class test accuracy (%) against its training images, coloured and named by group."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    _regions(ax, counts)
    for group, label, _colour in REGIONS:
        points = [(n, 100 * a) for n, a in zip(counts, per_class) if a is not None and group_of(n) == group]
        if points:
            mean = statistics.fmean(a for _, a in points)
            ax.scatter([n for n, _ in points], [a for _, a in points], s=16, zorder=3,
                       label=f"{label}: {len(points)} classes, mean {mean:.1f}%")
    ax.set_ylabel("test accuracy of the class (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class Curve:
    """A configuration's per-class accuracy over its seeds: the label, and per class (training images, mean,
    sample std or None)."""

    label: str
    seeds: int
    points: tuple[tuple[int, float, float | None], ...]


def sweep_figure(curves: Sequence[Curve], left_out: Sequence[str], title: str) -> Any:
    """Per-class accuracy of several configurations: a line per configuration (mean over seeds) in a band of
    ± one sample standard deviation, the group regions, and a note naming what could not be drawn."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    counts = [n for curve in curves for n, _, _ in curve.points] or [FEW_BELOW, MANY_ABOVE]
    _regions(ax, counts)
    for curve in curves:
        xs = [n for n, _, _ in curve.points]
        means = [m for _, m, _ in curve.points]
        (line,) = ax.plot(xs, means, marker="o", ms=3, zorder=3, label=f"{curve.label} ({curve.seeds} seed(s))")
        spread = [(n, m, s) for n, m, s in curve.points if s is not None]
        if spread:
            ax.fill_between([n for n, _, _ in spread], [m - s for _, m, s in spread], [m + s for _, m, s in spread],
                            color=line.get_color(), alpha=0.2, lw=0, zorder=2)
    ax.set_ylabel("test accuracy of the class (%)")
    ax.set_title(title, fontsize=10)
    if curves:
        ax.legend(fontsize=7, loc="lower right")
    if left_out:
        fig.text(0.01, 0.01, "left out (no finished run with per-class figures): " + "; ".join(left_out),
                 fontsize=7, color="#a61c00", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05 if left_out else 0, 1, 1))
    return fig


def save(fig: Any, path: Any) -> None:
    """Write the figure (the caller turns an OSError into its own message) and free it."""
    try:
        fig.savefig(path)
    finally:
        pyplot().close(fig)
