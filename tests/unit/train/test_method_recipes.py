"""The recipes of the methods since LDAM-DRW train a few epochs, tiny: each shipped job file as it is — its SAM or
ImbSAM, mixup, stage 2 with its own loss, weight decay, MaxNorm, BatchNorm setting — shortened with ``--epochs 2``
(stage 2 rescaled to one epoch) on small CIFAR sets in the official format, with ``small_cnn`` in place of the
ResNets (the CPU would take minutes per epoch of those). What each method computes is checked against its
reference in test_methods_reference.py and at world sizes 1, 2, 4 in test_world_size.py; here the recipes
themselves run end to end and record what the run promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hpc_train.train.__main__ import main  # noqa: E402

from . import cifar_files  # noqa: E402
from .helpers import REPO  # noqa: E402

RECIPES = ["cifar10_lt_ldam_drw_sam", "cifar100_lt_ldam_drw_sam", "cifar10_lt_mislas", "cifar100_lt_mislas",
           "cifar100_lt_wb", "cifar100_lt_imbsam"]


@pytest.fixture(autouse=True)
def _no_plot(monkeypatch):
    from hpc_train.train.observe import progress

    monkeypatch.setattr(progress, "plot_per_class", lambda *args, **kwargs: False)  # 0.7 s of matplotlib a run


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    cifar_files.write_cifar10(root, *cifar_files.make_arrays(10, 60, 5, seed=1))    # IF 100: 152 images
    cifar_files.write_cifar100(root, *cifar_files.make_arrays(100, 10, 1, seed=2))  # IF 10 below: 372 images
    return root


def test_the_method_recipes_are_shipped_and_listed():
    assert all((REPO / "jobs" / f"{name}.yaml").is_file() for name in RECIPES)
    import re

    table = (REPO / "docs" / "training.md").read_text().split("## Recipes")[1].split("\n## ")[0]
    listed = set(re.findall(r"`(\w+)\.yaml`", table))
    listed |= {f"cifar{n}_{rest}" for rest in re.findall(r"`cifar\{10,100\}_(\w+)\.yaml`", table) for n in (10, 100)}
    assert set(RECIPES) <= listed and {p.stem for p in (REPO / "jobs").glob("*.yaml")} <= listed  # every recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_method_recipe_trains_two_epochs(recipe, data_root, tmp_path, restore_signals, capsys):
    run_dir = tmp_path / "run"
    args = [str(REPO / "jobs" / f"{recipe}.yaml"), "--epochs", "2", "--run-dir", str(run_dir),
            "--set", f"train.data.root={data_root}", "--set", "slurm.gpus_per_node=0", "--set", "train.device=cpu",
            "--set", "train.model.name=small_cnn", "--set", "train.num_threads=1"]
    if recipe.startswith("cifar100"):
        args += ["--set", "train.data.imbalance_factor=10"]
    assert main(args) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    staged = "mislas" in recipe or "wb" in recipe
    assert [r["phase"] for r in records] == ["main", "main"] + (["crt"] if staged else [])
    assert all(0 <= r["ece"] <= 1 for r in records)
    assert summary["last"]["epoch"] == len(records) and summary["best"] is None  # no held-out split
    assert summary["best_on_test"]["top1"] == max(r["top1"] for r in records)
    plan = capsys.readouterr().err
    assert "training cifar" in plan
