"""`train --dry-run` runs one forward pass (issue 28, item 6), so a plug-in backbone whose feature_dim is not what
it gives is exit 2 in one line there, not a traceback at step 1; and its plan says that `train` run alone here
is one process (item 8: it said world size 2 while `train` ran 1). A real process, the plug-in a real module in the working
directory."""

import subprocess
import sys

import pytest

PLUGIN = """
import torch.nn as nn

def wrong_dim(num_classes, in_channels):
    body = nn.Sequential(nn.Conv2d(in_channels, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return body, 16          # says 16, gives 8

def right_dim(num_classes, in_channels):
    body = nn.Sequential(nn.Conv2d(in_channels, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return body, 8
"""


def _train(tmp_path, *sets):
    args = [sys.executable, "-m", "hpc_train.cli", "train", "digits_lt_demo", "--dry-run"]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.fixture
def plug(tmp_path):
    (tmp_path / "dimplug.py").write_text(PLUGIN)
    return tmp_path


def test_a_wrong_feature_dim_is_caught_by_the_dry_run(plug):
    # Before: the dry run printed the plan (exit 0); the run failed at step 1 with a matmul traceback.
    done = _train(plug, "train.model.name=dimplug:wrong_dim")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "one forward pass on a probe batch" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert not (plug / "runs").exists()


def test_the_plan_says_the_world_size_train_runs_here(plug):
    done = _train(plug, "train.model.name=dimplug:right_dim")
    assert done.returncode == 0, done.stderr
    assert "world size     2 (1 node(s) x 2 rank(s))" in done.stdout  # the job's launch, as planned
    assert "`train` run alone here is one process: world size 1" in done.stdout
