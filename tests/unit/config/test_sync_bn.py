"""The sync_bn decision (``auto``, true, false) and where it is shown: the script's header (torch-free)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpc_train.cli import cli
from hpc_train.config import sync_bn

JOBS = Path(__file__).resolve().parents[3] / "jobs"


@pytest.mark.parametrize("setting, world, batch, on, exact, text", [
    ("auto", 1, 128, False, False, "one rank"),
    ("auto", 4, 128, False, False, "32 images per rank >= 32"),
    ("auto", 8, 128, True, False, "16 images per rank < 32"),
    (True, 2, 128, True, True, "sync_bn: true, 64 images per rank"),
    (False, 32, 128, False, False, "sync_bn: false, 4 images per rank"),
    # true: the one BatchNorm arithmetic at every world size, one rank included (PyTorch's own kernel at world
    # size 1 rounds differently, and re-weighted training amplifies one flipped max-pool tie to 1e-2)
    (True, 1, 128, True, True, "sync_bn: true, 128 images per rank"),
])
def test_sync_bn_decision(setting, world, batch, on, exact, text):
    decision = sync_bn.rule(setting, world_size=world, batch_size=batch)
    assert decision.on is on and decision.exact is exact and text in decision.reason
    assert sync_bn.rule(True, world_size=4, batch_size=128, strategy="dp").on is False


# The lead's decision (review of issue 20, finding 7): CUDA keeps its fused SyncBatchNorm for sync_bn: true at
# world size > 1 and PyTorch's BatchNorm in one process; the one arithmetic at every world size is the CPU ranks'.
@pytest.mark.parametrize("setting, world, device, kernel", [
    (True, 1, "cuda", "batchnorm"), (True, 2, "cuda", "fused"), (True, 4, "cuda", "fused"),
    ("auto", 8, "cuda", "fused"), ("auto", 4, "cuda", "batchnorm"), (False, 8, "cuda", "batchnorm"),
    (True, 1, "cpu", "global"), (True, 2, "cpu", "global"), (True, 4, "cpu", "global"),
    ("auto", 8, "cpu", "global"), ("auto", 1, "cpu", "batchnorm"), ("auto", 4, "cpu", "batchnorm"),
    (False, 8, "cpu", "batchnorm"),
])
def test_batchnorm_kernel_by_device_and_world_size(setting, world, device, kernel):
    decision = sync_bn.rule(setting, world_size=world, batch_size=128)
    assert decision.kernel(world, device) == kernel


def test_render_shows_the_batchnorm_decision():
    runner = CliRunner()
    job = str(JOBS / "cifar10_lt_ldam_drw.yaml")
    eight = runner.invoke(cli, ["render", job, "--gpus", "8"]).stdout
    assert "# BatchNorm: synchronised across ranks (sync_bn: auto, 16 images per rank < 32)" in eight
    four = runner.invoke(cli, ["render", job, "--gpus", "4"]).stdout
    assert "# BatchNorm: per rank (sync_bn: auto, 32 images per rank >= 32)" in four
    forced = runner.invoke(cli, ["render", job, "--gpus", "2", "--set", "train.sync_bn=true"]).stdout
    assert ("# BatchNorm: synchronised across ranks, on CPUs the same arithmetic at every world size (sync_bn: "
            "true, 64 images per rank)") in forced
    bad = runner.invoke(cli, ["render", job, "--set", "train.sync_bn=1"])
    assert bad.exit_code == 2 and "train.sync_bn: must be one of 'auto', True, False, got '1'" in bad.output
