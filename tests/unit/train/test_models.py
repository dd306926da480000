"""Model shapes and sizes against independent references."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from hpc_train.config import ModelConfig  # noqa: E402
from hpc_train.train.model.models import build_model, unwrap  # noqa: E402
from torch import nn  # noqa: E402


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet32_is_ldam_drws_network():
    model = build_model(ModelConfig(name="resnet32"), num_classes=10, in_channels=3)
    assert _params(model) == 464_154  # the notes' re-implementation of LDAM-DRW's resnet32 (§1.4)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    # Option-A shortcuts have no parameters: only convolutions, BatchNorms and the head.
    kinds = {type(m).__name__ for m in model.modules() if any(True for _ in m.parameters(recurse=False))}
    assert kinds == {"Conv2d", "BatchNorm2d", "Linear"}


def test_cosine_classifier_is_bounded():
    model = build_model(ModelConfig(name="resnet32", classifier="cosine"), num_classes=100, in_channels=3)
    out = model(torch.randn(4, 3, 32, 32) * 5)
    assert out.shape == (4, 100) and out.abs().max() <= 1.0 + 1e-5


def test_torchvision_resnext_matches_torchvision():
    from torchvision import models as tv

    ours = build_model(ModelConfig(name="resnext50_32x4d"), num_classes=1000, in_channels=3)
    assert _params(ours) == _params(tv.resnext50_32x4d(weights=None))
    small = build_model(ModelConfig(name="resnet18"), num_classes=7, in_channels=1)
    assert small(torch.zeros(2, 1, 64, 64)).shape == (2, 7)


def test_small_cnn_and_unwrap():
    model = build_model(ModelConfig(name="small_cnn"), num_classes=10, in_channels=1)
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert unwrap(torch.nn.DataParallel(model)) is model


def test_exact_batchnorm_is_batchnorm_in_one_process_too():
    """sync_bn: true on CPU ranks converts every BatchNorm to GlobalBatchNorm at every world size (exact), and in
    one process (no process group) it trains as BatchNorm does: batch statistics, running statistics updated
    with the unbiased variance."""
    from hpc_train.train.model.batchnorm import GlobalBatchNorm, synchronise_batchnorm

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    converted = synchronise_batchnorm(copy.deepcopy(plain), "global")
    assert isinstance(converted[1], GlobalBatchNorm)
    x = torch.randn(8, 3, 6, 6) * 3 + 1
    expected, got = plain(x), converted(x)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(converted[1].running_mean, plain[1].running_mean, atol=1e-6)
    assert torch.allclose(converted[1].running_var, plain[1].running_var, atol=1e-5)


def test_each_batchnorm_kernel_converts_to_its_module():
    # CUDA at world size > 1: the fused SyncBatchNorm; "batchnorm": PyTorch's own, left as it is.
    from hpc_train.train.model.batchnorm import GlobalBatchNorm, synchronise_batchnorm

    fused = synchronise_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), "fused")
    assert type(fused[1]) is nn.SyncBatchNorm
    kept = synchronise_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), "batchnorm")
    assert type(kept[1]) is nn.BatchNorm2d and not isinstance(kept[1], GlobalBatchNorm)
