"""Every shipped recipe, shortened with ``--epochs 3``, passes ``--dry-run`` on generated data (CIFAR files in
the official format, a miniature ImageNet-LT list-file set, the bundled digits) and says what it rescaled."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
from PIL import Image  # noqa: E402

from hpc_train.train.__main__ import main  # noqa: E402

from . import cifar_files  # noqa: E402
from .helpers import REPO  # noqa: E402

RECIPES = sorted((REPO / "jobs").glob("*.yaml"))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """One root for every recipe: small CIFAR-10/100 sets and ImageNet-LT-style lists of a few images."""
    root = tmp_path_factory.mktemp("data")
    cifar_files.write_cifar10(root, *cifar_files.make_arrays(10, 100, 10, seed=1))
    cifar_files.write_cifar100(root, *cifar_files.make_arrays(100, 100, 2, seed=2))
    for split, per_class in (("train", 6), ("val", 2), ("test", 2)):
        lines = []
        for label in range(3):
            for i in range(per_class if split != "train" else per_class - 2 * label):
                rel = f"{split}/c{label}/{i}.png"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (24, 24), (80 * label, 40, 200 - 60 * label)).save(root / rel)
                lines.append(f"{rel} {label}")
        (root / f"ImageNet_LT_{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def expected_changes(recipe: Path, n: int) -> str:
    """The change line, from the recipe's own values and the documented rule (x * N / E rounded half up;
    indices kept in [0, N); non-zero lengths at least 1, the warm-up below N)."""
    t = yaml.safe_load(recipe.read_text())["train"]
    e = t["epochs"]
    scaled = lambda x: math.floor(x * n / e + 0.5)  # noqa: E731
    parts = [f"train.epochs {e} -> {n}"]
    warmup = t.get("schedule", {}).get("warmup_epochs", 0)
    if warmup:
        parts.append(f"train.schedule.warmup_epochs {warmup} -> {min(n - 1, max(1, scaled(warmup)))}")
    milestones = t.get("schedule", {}).get("milestones", [])
    if milestones:
        new = [min(n - 1, scaled(m)) for m in milestones]
        parts.append(f"train.schedule.milestones [{', '.join(map(str, milestones))}] -> [{', '.join(map(str, new))}]")
    drw = t.get("loss", {}).get("drw_epoch")
    if drw is not None:
        parts.append(f"train.loss.drw_epoch {drw} -> {min(n - 1, scaled(drw))}")
    crt = t.get("two_stage", {}).get("crt_epochs", 0)
    if crt:
        parts.append(f"train.two_stage.crt_epochs {crt} -> {max(1, scaled(crt))}")
    return f"--epochs {n}: " + ", ".join(parts)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_runs_three_epochs_in_a_dry_run(recipe, data_root, capsys, restore_signals):
    assert main([str(recipe), "--epochs", "3", "--dry-run", "--set", f"train.data.root={data_root}"]) == 0
    captured = capsys.readouterr()
    assert expected_changes(recipe, 3) in captured.err
    assert "\n  epochs         3" in captured.out and "batchnorm" in captured.out
