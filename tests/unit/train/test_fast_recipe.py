"""The CIFAR recipes of issue 21: they checkpoint by time, and the speed recipe, jobs/cifar10_lt_ldam_drw_fast.yaml,
is the LDAM-DRW recipe with only its speed switches changed, whose long-tail numbers stay the plain recipe's within
noise.

* Every shipped CIFAR recipe sets ``checkpoint_every_s`` (not a checkpoint every epoch); the keys' defaults stay.
* What differs between the two files is the name and the speed switches, nothing of the method.
* Both train, tiny, on the CPU in eager (CIFAR-10-LT files in the official format with learnable images:
  ``cifar_files.learnable_arrays``; ResNet-32 as shipped; ``--epochs 4``, batch 16 with the linear lr scaling
  rule; the plain recipe at two seeds, the fast one at one: three runs at once, ~20 s on 2 cores), and every
  long-tail test metric of the fast recipe — top-1, balanced, many, medium, few — lies within the noise of the
  plain one's mean over its seeds. The noise: three standard errors of a difference of two proportions over
  those test images (the test split's sampling error) plus the plain recipe's own change from one seed to the
  other. Fixed before the runs, not fitted to them. (On the CPU bf16 runs as it does on a GPU, without tensor
  cores; the GPU session measures the real thing's accuracy.)
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import yaml

from . import cifar_files
from .helpers import PYTHON, REPO, clean_env

PLAIN, FAST = REPO / "jobs" / "cifar10_lt_ldam_drw.yaml", REPO / "jobs" / "cifar10_lt_ldam_drw_fast.yaml"
SPEED_SWITCHES = {"amp", "channels_last", "cuda_graphs", "compile", "amp_weight_copy", "tf32"}
METRICS = ("top1", "balanced", "many", "medium", "few")
SEEDS = (0, 1)
TEST_PER_CLASS = 40


def test_the_fast_recipe_changes_only_speed_switches():
    plain, fast = (yaml.safe_load(path.read_text()) for path in (PLAIN, FAST))
    assert fast["name"] == plain["name"] + "-fast" and fast["slurm"] == plain["slurm"]
    changed = {k for k in plain["train"].keys() | fast["train"].keys() if plain["train"].get(k) != fast["train"].get(k)}
    assert changed <= SPEED_SWITCHES, changed
    assert (fast["train"]["amp"], fast["train"]["channels_last"], fast["train"]["cuda_graphs"]) == ("bf16", True, "auto")


def _train(recipe: Path, seed: int, data: Path, tmp: Path) -> subprocess.Popen:
    run_dir = tmp / f"{recipe.stem}-{seed}"
    args = [str(recipe), "--epochs", "4", "--run-dir", str(run_dir), "--set", f"train.data.root={data}",
            "--set", "slurm.gpus_per_node=0", "--set", "train.device=cpu", "--set", "train.num_threads=1",
            "--set", "train.batch_size=16", "--set", "train.optim.scale_lr=true", "--set", f"train.seed={seed}",
            "--set", "train.eval_every_epochs=4"]
    log = open(tmp / f"{recipe.stem}-{seed}.log", "w")
    return subprocess.Popen([PYTHON, "-m", "hpc_train.train", *args], cwd=REPO, env=clean_env(tmp), stdout=log,
                            stderr=subprocess.STDOUT)


def _last(tmp: Path, recipe: Path, seed: int) -> dict:
    return json.loads((tmp / f"{recipe.stem}-{seed}" / "summary.json").read_text())["last"]


def test_the_fast_recipes_long_tail_metrics_are_the_plain_recipes_within_noise(tmp_path):
    data = tmp_path / "cifar"
    cifar_files.write_cifar10(data, *cifar_files.learnable_arrays(10, 101, TEST_PER_CLASS, seed=1))
    runs = {(r, s): _train(r, s, data, tmp_path) for r, seeds in ((PLAIN, SEEDS), (FAST, SEEDS[:1])) for s in seeds}
    for (recipe, seed), proc in runs.items():
        assert proc.wait(timeout=300) == 0, (tmp_path / f"{recipe.stem}-{seed}.log").read_text()[-3000:]
    last = {key: _last(tmp_path, *key) for key in runs}
    groups = {"many": 1, "medium": 3, "few": 6}  # 101 training images (> 100), 61 to 21, 13 and fewer
    assert last[PLAIN, 0]["top1"] >= 0.3 and last[PLAIN, 0]["few"] > 0, last[PLAIN, 0]  # it learned: not vacuous
    for metric in METRICS:
        n = TEST_PER_CLASS * groups.get(metric, 10)  # test images behind one run's figure
        plain = sum(last[PLAIN, s][metric] for s in SEEDS) / len(SEEDS)
        fast = last[FAST, SEEDS[0]][metric]
        sampling = 3 * math.sqrt(plain * (1 - plain) / (n * len(SEEDS)) + fast * (1 - fast) / n)
        seed_to_seed = abs(last[PLAIN, SEEDS[0]][metric] - last[PLAIN, SEEDS[1]][metric])
        assert abs(fast - plain) <= sampling + seed_to_seed, (metric, plain, fast, sampling, seed_to_seed)


def test_the_shipped_cifar_recipes_checkpoint_by_time_and_the_defaults_stay():
    from hpc_train.config import TrainConfig

    recipes = sorted((REPO / "jobs").glob("cifar*.yaml"))
    assert len(recipes) >= 14
    for path in recipes:
        train = yaml.safe_load(path.read_text())["train"]
        assert train.get("checkpoint_every_s", 0) > 0 and "checkpoint_every_epochs" not in train, path.name
    defaults = TrainConfig()
    assert (defaults.checkpoint_every_s, defaults.checkpoint_every_epochs) == (None, 1)  # a job file's default
