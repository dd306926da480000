"""The pictures people look at (issue 19): the trainer's per-class accuracy plot has a legend, names the many /
medium / few regions and says which epoch it shows; `report --plot` has a title, the group boundaries, the
spread over seeds and a note naming the configurations it left out. The figures are caught as they are saved."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hpc_train.runs import report  # noqa: E402
from hpc_train.runs.index import load_run  # noqa: E402

COUNTS = [124, 101, 100, 60, 40, 20, 19, 12, 8, 6]  # many, many, medium x4 (100 and 20 included), few x4


@pytest.fixture
def saved(monkeypatch):
    figures: list[Figure] = []
    original = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _texts(fig: Figure) -> str:
    return " | ".join(t.get_text() for ax in fig.axes for t in ax.texts) + " | " + " | ".join(t.get_text() for t in fig.texts)


def test_the_per_class_plot_has_a_legend_the_regions_and_its_epoch(tmp_path, saved):
    pytest.importorskip("torch")
    from hpc_train.train.observe.progress import finish, wait_for_pictures

    record = {"epoch": 7, "phase": "main", "top1": 0.5, "balanced": 0.5, "many": 0.9, "medium": 0.5, "few": 0.1,
              "per_class": [0.95, 0.9, 0.7, 0.6, 0.5, 0.4, 0.2, 0.1, 0.0, 0.1]}
    timing = {"epochs": 7, "wall_s": 1.0, "setup_s": 0.1, "train_images_per_s": 10.0, "eval_images_per_s": 10.0}
    finish(run_dir=tmp_path, data_name="digits-lt", num_classes=10, total_epochs=7, global_step=70, world_size=1,
           counts=COUNTS, best=record, last=record, tau_record=None, timing=timing, is_main=True)
    wait_for_pictures()  # drawn in the background, after the end line
    (fig,) = saved
    (ax,) = fig.axes
    assert "last epoch (7)" in ax.get_title() and "digits-lt" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["few (<20): 4 classes, mean 10.0%", "medium: 4 classes, mean 55.0%",
                      "many (>100): 2 classes, mean 92.5%"]
    assert all(name in _texts(fig) for name in ("few (<20)", "medium", "many (>100)"))
    assert (tmp_path / "per_class_accuracy.png").read_bytes()[:4] == b"\x89PNG"


def _run(group, name, loss, seed, per_class, state="completed"):
    run_dir = group / name
    run_dir.mkdir(parents=True)
    (run_dir / "job.yaml").write_text("name: x\n")
    (run_dir / "config.json").write_text(json.dumps({"name": "lt", "train": {"loss": {"name": loss}, "seed": seed}}))
    (run_dir / "run.json").write_text(json.dumps({"job_id": name, "cluster": "local"}))
    (run_dir / "class_counts.json").write_text(json.dumps({"train_counts": COUNTS}))
    if per_class:
        (run_dir / "metrics.jsonl").write_text(json.dumps({"phase": "main", "epoch": 3, "global_step": 9, "top1": 0.5,
                                                           "per_class": per_class}) + "\n")
    return report.load(load_run(run_dir), state)


def test_the_report_plot_has_a_title_the_groups_the_spread_and_says_what_it_left_out(tmp_path, saved):
    group = tmp_path / "runs" / "lt"
    results = [_run(group, f"60_{i}", loss, seed, [0.1 * (i + 1)] * 10 if loss != "focal" else None,
                    "completed" if loss != "focal" else "failed")
               for i, (loss, seed) in enumerate([(l, s) for l in ("ce", "balanced_softmax", "focal") for s in (0, 1)])]
    data = report.summarise(results)
    report.plot(results, data, tmp_path / "sweep.png")
    (fig,) = saved
    (ax,) = fig.axes
    assert "mean ± sample std over train.seed" in ax.get_title() and "4 finished run(s) in 2 of 3" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["loss.name=ce (2 seed(s))",
                                                                 "loss.name=balanced_softmax (2 seed(s))"]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_zorder() == 2]
    assert len(bands) == 2  # ± one sample std over the two seeds of each drawn configuration
    assert {line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"} == {20, 100}
    assert "left out (no finished run with per-class figures): loss.name=focal (2 failed)" in _texts(fig)
    assert all(name in _texts(fig) for name in ("few (<20)", "medium", "many (>100)"))


def test_the_plots_groups_are_the_evaluations():
    pytest.importorskip("torch")
    from hpc_train.runs import plots
    from hpc_train.train.observe import metrics

    assert (plots.MANY_ABOVE, plots.FEW_BELOW) == (metrics.MANY_ABOVE, metrics.FEW_BELOW)
    assert [plots.group_of(n) for n in COUNTS] == [metrics.shot_group(n) for n in COUNTS]
