"""Networks: a feature backbone plus a classifier, so cRT can re-train the classifier alone.

``resnet32`` is kaidic/LDAM-DRW's CIFAR ResNet (``resnet_cifar.py``: 3 stages of 5 basic blocks, widths
16/32/64, option-A shortcuts that subsample and zero-pad channels, Kaiming-normal init): 464,154
parameters with a 10-class linear head. torchvision's ResNet/ResNeXt are built without pretrained
weights (nothing can be downloaded on a compute node, and long-tail benchmarks train from scratch).
``small_cnn`` is a few-layer CNN for the 8×8 digits demo. ``resnet34_cifar`` is the ResNet-34 weight balancing
and ImbSAM train on CIFAR (``utils/network_arch_resnet.py``'s ``ResnetEncoder``): torchvision's ResNet-34 with
a 3×3 stride-1 first convolution and no max-pool.

The linear classifier starts as its reference starts it: Kaiming-normal weights where the backbone's code
initialises every ``nn.Linear`` so (LDAM-DRW's ``resnet_cifar.py``, ``_weights_init``; MiSLAS's CIFAR
classifier copies it) — ``resnet32``, and ``small_cnn`` and plug-ins, which have no reference and keep what
they always had — and PyTorch's default ``nn.Linear`` init (uniform, std 1/√(3d)) for the torchvision
networks, as classifier-balancing's ``DotProduct_Classifier`` and weight balancing's ``ResnetEncoder`` create
theirs. cRT re-creates the classifier with PyTorch's default
init whatever the network (classifier-balancing builds a new ``nn.Linear``).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import ModelConfig, TrainConfig
from ...config.plugins import is_import_path
from ...errors import ConfigError
from ...plugin_loading import call as call_plugin


class NormedLinear(nn.Module):
    """Cosine classifier (LDAM-DRW): normalised features times normalised class vectors, in [-1, 1].
    ``weight`` is (classes, features) like nn.Linear, so τ-normalisation and cRT treat both alike."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features).uniform_(-1, 1))
        # LDAM-DRW: uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5) — every class vector gets norm 1.
        with torch.no_grad():
            self.weight.copy_(F.normalize(self.weight, dim=1))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1) @ F.normalize(self.weight, dim=1).t()


class LongTailNet(nn.Module):
    def __init__(self, backbone: nn.Module, feature_dim: int, num_classes: int, classifier: str, *,
                 kaiming: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.feature_dim = feature_dim
        self.classifier_kind = classifier
        self.classifier = make_classifier(feature_dim, num_classes, classifier, kaiming=kaiming)

    def forward(self, x: Tensor) -> Tensor:
        features = self.backbone(x)
        if not torch.is_autocast_enabled(features.device.type):
            return self.classifier(features)
        # The classifier and the loss in float32 under AMP, as evaluation runs them: a cosine head in bf16 is
        # off by up to ~0.1 logit once LDAM scales it by 30, against a head-class margin of ~0.16 × 30.
        with torch.autocast(device_type=features.device.type, enabled=False):
            return self.classifier(features.float())


def make_classifier(feature_dim: int, num_classes: int, kind: str, *, kaiming: bool = False) -> nn.Module:
    """The classifier: cosine (LDAM's NormedLinear) or linear, PyTorch's default init unless ``kaiming``
    (the module docstring says which networks)."""
    if kind == "cosine":
        return NormedLinear(feature_dim, num_classes)
    layer = nn.Linear(feature_dim, num_classes)
    if kaiming:
        nn.init.kaiming_normal_(layer.weight)
    return layer


# --------------------------------------------------------------------------------------------------
# ResNet-32 for CIFAR (option A)
# --------------------------------------------------------------------------------------------------


class _ShortcutA(nn.Module):
    """Option A: take every other pixel and zero-pad the new channels (no parameters)."""

    def __init__(self, planes: int) -> None:
        super().__init__()
        self.pad = planes // 4

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))


class _BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = _ShortcutA(planes)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The backbone of LDAM-DRW's ``resnet32``: returns the 64-d pooled features."""

    def __init__(self, blocks_per_stage: int = 5, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks_per_stage):
                layers.append(_BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return out.mean(dim=(2, 3))  # global average pool (deterministic backward on CUDA, unlike adaptive pooling)


# --------------------------------------------------------------------------------------------------
# A small CNN for digits
# --------------------------------------------------------------------------------------------------


def small_cnn(in_channels: int) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(in_channels, 32), *block(32, 64), nn.MaxPool2d(2),
        *block(64, 128), _GlobalAveragePool(),
    )  # fmt: skip


class _GlobalAveragePool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.mean(dim=(2, 3))


# --------------------------------------------------------------------------------------------------
# torchvision ResNet / ResNeXt
# --------------------------------------------------------------------------------------------------


def _torchvision_backbone(name: str, in_channels: int, *, cifar_stem: bool = False) -> tuple[nn.Module, int]:
    from torchvision import models as tv

    net = getattr(tv, name)(weights=None)
    if cifar_stem:  # weight balancing's ResnetEncoder: a new conv1 3x3 stride 1 (PyTorch's default init, as it is
        # created after torchvision's init), no max-pool: 32 -> 4 pixels at layer4, then the global average pool
        net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    feature_dim = net.fc.in_features
    net.fc = nn.Identity()
    return net, feature_dim


def _torchvision(name: str, *, cifar_stem: bool = False) -> Callable[[ModelConfig, int, int], LongTailNet]:
    def build(cfg: ModelConfig, num_classes: int, in_channels: int) -> LongTailNet:
        backbone, feature_dim = _torchvision_backbone(name, in_channels, cifar_stem=cifar_stem)
        return LongTailNet(backbone, feature_dim, num_classes, cfg.classifier)

    return build


MODELS: dict[str, Callable[[ModelConfig, int, int], LongTailNet]] = {
    "resnet32": lambda cfg, classes, channels: LongTailNet(CifarResNet(5, channels), 64, classes, cfg.classifier,
                                                           kaiming=True),
    "small_cnn": lambda cfg, classes, channels: LongTailNet(small_cnn(channels), 128, classes, cfg.classifier,
                                                            kaiming=True),
    **{name: _torchvision(name) for name in ("resnet18", "resnet34", "resnet50", "resnet101", "resnext50_32x4d",
                                             "resnext101_32x8d")},
    "resnet34_cifar": _torchvision("resnet34", cifar_stem=True),
}
"""The built-in models, by the names ``train.model.name`` takes (``config.ModelName``: a test ties them);
each ``(model config, classes, input channels) -> LongTailNet``."""


def build_plugin_model(cfg: ModelConfig, *, num_classes: int, in_channels: int) -> LongTailNet:
    """A plug-in model (docs/training.md, Plug-ins): ``build(num_classes=..., in_channels=..., **args)`` returns a
    feature backbone, an ``nn.Module`` mapping images ``(N, C, H, W)`` to features ``(N, D)`` with ``D`` as its
    ``feature_dim`` attribute, or the pair ``(module, D)``. The configured classifier (``model.classifier``:
    linear or cosine) goes on top, so cRT, τ-normalisation and LDAM's cosine head work as with the built-in
    models."""
    made = call_plugin(cfg.name, "model", dict(cfg.args), num_classes=num_classes, in_channels=in_channels)
    if isinstance(made, LongTailNet):
        return made
    backbone, feature_dim = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    feature_dim = feature_dim if feature_dim is not None else getattr(backbone, "feature_dim", None)
    if not isinstance(backbone, nn.Module) or not isinstance(feature_dim, int) or feature_dim < 1:
        raise ConfigError(f"train.model.name: {cfg.name} returned {type(made).__name__}; a plug-in model returns "
                          "an nn.Module with an int feature_dim attribute, or (module, feature_dim)")
    return LongTailNet(backbone, feature_dim, num_classes, cfg.classifier, kaiming=True)  # as before: no reference


def build_model(cfg: ModelConfig, *, num_classes: int, in_channels: int) -> LongTailNet:
    """The model ``cfg`` names: a built-in one, or a plug-in's (:func:`build_plugin_model`)."""
    if is_import_path(cfg.name):
        return build_plugin_model(cfg, num_classes=num_classes, in_channels=in_channels)
    return MODELS[cfg.name](cfg, num_classes, in_channels)


def init_model(cfg: TrainConfig, data) -> LongTailNet:
    """The model at step 0 for ``data`` (a DataSource): seeded, so every rank (and a test) builds the same
    initial weights."""
    from ..data.samplers import derive_seed

    torch.manual_seed(derive_seed("model", cfg.seed))
    model = build_model(cfg.model, num_classes=data.num_classes, in_channels=data.in_channels)
    if cfg.loss.name == "sigmoid_focal" and isinstance(model.classifier, nn.Linear):
        # Cui et al.'s sigmoid and focal losses start every class at p = 1/C (src/model_base.py, bias_initializer).
        with torch.no_grad():
            model.classifier.bias.fill_(-math.log(max(data.num_classes - 1, 1)))
    return model


def unwrap(model: nn.Module) -> LongTailNet:
    """The LongTailNet inside DDP / DataParallel / torch.compile wrappers."""
    while not isinstance(model, LongTailNet):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            raise TypeError(f"no LongTailNet inside {type(model).__name__}")
        model = inner
    return model
