"""``--epochs N``: the rescaling rule by hand, and through render and submit (torch-free)."""

import math
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpc_train.cli import cli
from hpc_train.config import JobSpec, build, epochs, validate
from hpc_train.errors import ConfigError

JOBS = Path(__file__).resolve().parents[3] / "jobs"


def spec(**train):
    return validate(build(JobSpec, {"slurm": {"tasks_per_node": 1}, "train": {"device": "cpu", **train}}))


def by_hand(x: int, old: int, new: int) -> int:
    """The documented rounding, written with math: x * N / E rounded half up."""
    return math.floor(x * new / old + 0.5)


def test_rescaling_rule_by_hand():
    s = spec(epochs=200, schedule={"name": "multistep", "warmup_epochs": 5, "milestones": [40, 160, 180]},
             loss={"name": "ce", "drw_epoch": 160}, sampler={"name": "progressive", "progressive_epochs": 100})
    for n in (1, 2, 3, 7, 50, 199, 200, 400):
        out, changes = epochs.rescale(s, n)
        t = out.train
        assert t.epochs == n
        # indices: rounded, then kept inside [0, n): order preserved (ties allowed)
        assert list(t.schedule.milestones) == [min(n - 1, by_hand(m, 200, n)) for m in (40, 160, 180)]
        assert list(t.schedule.milestones) == sorted(t.schedule.milestones)
        assert all(0 <= m < n for m in t.schedule.milestones) and 0 <= t.loss.drw_epoch < n
        assert t.loss.drw_epoch == min(n - 1, by_hand(160, 200, n))
        # lengths: a non-zero one stays >= 1; the warm-up stays below n
        assert t.schedule.warmup_epochs == min(n - 1, max(1, by_hand(5, 200, n)))
        assert t.sampler.progressive_epochs == max(1, by_hand(100, 200, n))
        assert {c.key for c in changes} >= ({"train.epochs"} if n != 200 else set())
    same, changes = epochs.rescale(s, 200)
    assert same == s and changes == []
    assert "nothing to change" in epochs.describe(200, changes)


def test_rescaling_lengths_and_unset_keys():
    s = spec(epochs=90, two_stage={"crt_epochs": 10}, schedule={"name": "cosine"})
    out, changes = epochs.rescale(s, 3)
    assert out.train.two_stage.crt_epochs == 1  # 10 * 3 / 90 = 0.33: shortened, not dropped
    assert out.train.schedule.warmup_epochs == 0 and out.train.loss.drw_epoch is None  # 0 and unset stay
    assert out.train.sampler.progressive_epochs is None
    assert epochs.describe(3, changes) == "--epochs 3: train.epochs 90 -> 3, train.two_stage.crt_epochs 10 -> 1"
    with pytest.raises(ConfigError, match="at least 1"):
        epochs.rescale(s, 0)


def test_render_and_submit_take_epochs_and_say_what_changed():
    runner = CliRunner()
    result = runner.invoke(cli, ["render", str(JOBS / "cifar10_lt_ldam_drw.yaml"), "--epochs", "3"])
    assert result.exit_code == 0, result.output
    assert ("--epochs 3: train.epochs 200 -> 3, train.schedule.warmup_epochs 5 -> 1, train.schedule.milestones "
            "[160, 180] -> [2, 2], train.loss.drw_epoch 160 -> 2") in result.stderr
    # The resolved job is one shell word in the preamble (hpc_train/render/variables.py): what the ranks will run.
    word = shlex.shlex(result.stdout.split("\nreadonly HT_JOB_YAML=", 1)[1], posix=True)
    word.whitespace_split = True
    train = yaml.safe_load(word.get_token())["train"]
    assert (train["epochs"], train["schedule"]["milestones"], train["loss"]["drw_epoch"]) == (3, [2, 2], 2)
    local = runner.invoke(cli, ["submit", "--cluster", "local", "--dry-run", "--epochs", "2"])
    assert local.exit_code == 0 and "--epochs 2: train.epochs 30 -> 2" in local.stderr
    bad = runner.invoke(cli, ["render", "--epochs", "0"])
    assert bad.exit_code == 2 and "0 is not in the range x>=1" in bad.output


def test_epochs_past_the_integer_range_are_refused_before_anything_is_written(tmp_path):
    # Review of issue 19, M9: --epochs came after the reader's integer check; render printed a job.yaml its
    # own reader refused, and submit created the run before the rank refused it.
    from hpc_train.config import NO_SITE, resolve
    from tests.cli_helpers import assert_refused, cli as run_cli, tree

    with pytest.raises(ConfigError, match=r"--epochs 99999999999: train.epochs would be 99999999999, out of range"):
        resolve(None, site=NO_SITE, epochs=99_999_999_999)
    with pytest.raises(ConfigError, match=r"train.two_stage.crt_epochs would be 66666666667, out of range"):
        resolve(None, site=NO_SITE, sets=["train.two_stage.crt_epochs=1000"], epochs=2_000_000_000)
    assert resolve(None, site=NO_SITE, epochs=2**31 - 1).spec.train.epochs == 2**31 - 1
    before = tree(tmp_path)
    for args in (["render", "--epochs", "99999999999", "-o", "s.sbatch"],
                 ["submit", "--cluster", "local", "--gpus", "0", "--epochs", "99999999999"]):
        assert_refused(run_cli(*args, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                         "HPC_TRAIN_STATE_DIR": str(tmp_path / "state"),
                                                         "PYTHONPATH": __import__("os").environ.get("PYTHONPATH", "")}),
                       "out of range")
    assert tree(tmp_path) == before
