"""Building the plug-ins a job names (``model: {name: "mylab.models:build", args: {...}}``): the torch side of
:mod:`hpc_train.config.plugins`, which imports them and checks their arguments. Documented signatures
(docs/training.md, Plug-ins):

* model ``build(num_classes=..., in_channels=..., **args)`` returns a feature backbone — an ``nn.Module``
  mapping images ``(N, C, H, W)`` to features ``(N, D)``, with ``D`` as its ``feature_dim`` attribute, or the
  pair ``(module, D)``. hpc-train puts the configured classifier (``model.classifier``: linear or cosine) on
  top, so cRT, τ-normalisation and LDAM's cosine head work as with the built-in models.
* loss ``build(counts=[n_0, ...], **args)`` returns ``loss(logits, target)`` giving *per-sample* values
  ``(batch,)``; the trainer weights them (``reweight``, ``drw_epoch``) and normalises over the global batch
  (:class:`~hpc_train.train.model.losses.LongTailLoss`), so the plug-in is right at any world size.
* data ``load(data_config, **args)`` returns a :class:`~hpc_train.train.data.datasets.DataSource`
  (``ArraySplit``: uint8 ``N×C×H×W`` in memory; ``FileSplit``: image files).

The captured GPU step (``train.cuda_graphs``) does not assume a plug-in model or loss is capture-safe:
:func:`capture_check_required` names them, and their warm-up steps run under a recording host-sync guard
(:class:`~hpc_train.train.loop.graphs.CapturedSteps`); a value read back to the host there keeps the run eager,
with one log line.
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import Tensor, nn

from ...config import DataConfig, LossConfig, ModelConfig, TrainConfig, plugins
from ...errors import ConfigError


def _call(name: str, kind: str, args: dict[str, Any], **passed: Any) -> Any:
    function = plugins.load(name, kind)
    plugins.check_arguments(function, kind, args, name)
    return function(**passed, **args)


def build_model(cfg: ModelConfig, *, num_classes: int, in_channels: int):
    from .models import LongTailNet

    made = _call(cfg.name, "model", dict(cfg.args), num_classes=num_classes, in_channels=in_channels)
    if isinstance(made, LongTailNet):
        return made
    backbone, feature_dim = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    feature_dim = feature_dim if feature_dim is not None else getattr(backbone, "feature_dim", None)
    if not isinstance(backbone, nn.Module) or not isinstance(feature_dim, int) or feature_dim < 1:
        raise ConfigError(f"train.model.name: {cfg.name} returned {type(made).__name__}; a plug-in model returns "
                          "an nn.Module with an int feature_dim attribute, or (module, feature_dim)")
    return LongTailNet(backbone, feature_dim, num_classes, cfg.classifier, kaiming=True)  # as before: no reference


def build_loss(cfg: LossConfig, counts: Sequence[int], world_size: int = 1):
    from .losses import LongTailLoss

    function = _call(cfg.name, "loss", dict(cfg.args), counts=[int(c) for c in counts])
    if not callable(function):
        raise ConfigError(f"train.loss.name: {cfg.name} returned {type(function).__name__}, not a loss(logits, target)")

    class Plugin(LongTailLoss):
        """The user's per-sample loss, weighted by the class weight of each target (ones unless ``reweight`` or
        DRW) and normalised over the global batch's summed weights (its size when unweighted)."""

        def __init__(self) -> None:
            super().__init__(counts, cfg, world_size)
            self.function = function  # an nn.Module is registered (it follows .to(device))

        def per_sample(self, logits: Tensor, target: Tensor) -> Tensor:
            logits, weight = self._prepare(logits)
            values = self.function(logits, target)
            if not isinstance(values, Tensor) or values.shape != target.shape:
                shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
                raise ConfigError(f"train.loss.name: {cfg.name} must return per-sample values of shape "
                                  f"{tuple(target.shape)} (the trainer normalises over the global batch); got {shape}")
            return values.to(logits.dtype) * weight[target]

    return Plugin()


PROBE_BATCH = 4


def probe_loss(cfg: LossConfig, counts: Sequence[int]) -> str:
    """Build a plug-in loss and call it on a batch of :data:`PROBE_BATCH` random logits, as the trainer does: it
    must give per-sample values of shape ``(batch,)`` (a scalar — a mean over the batch — is refused, exit 2:
    the trainer normalises over the global batch). Returns what it checked, for the dry run's line."""
    import torch

    loss = build_loss(cfg, counts)
    classes = len(counts)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(PROBE_BATCH, classes, generator=generator)
    target = torch.arange(PROBE_BATCH) % classes
    try:
        loss.per_sample(logits, target)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is a configuration error
        raise ConfigError(f"train.loss.name: {cfg.name} fails on a batch of {PROBE_BATCH} CPU logits "
                          f"({type(exc).__name__}: {exc})") from None
    return f"called on {PROBE_BATCH} x {classes} logits: per-sample values of shape ({PROBE_BATCH},)"


def load_data(cfg: DataConfig):
    from ..data.datasets import DataSource

    data = _call(cfg.name, "data", dict(cfg.args), config=cfg)
    if not isinstance(data, DataSource):
        raise ConfigError(f"train.data.name: {cfg.name} returned {type(data).__name__}; a plug-in data set returns "
                          "a hpc_train.train.data.datasets.DataSource")
    return data


def capture_check_required(cfg: TrainConfig) -> list[str]:
    """The plug-ins whose step is not known to be capture-safe (the captured GPU step runs them only after
    its capture check passed; eager otherwise, with one log line saying so)."""
    return [f"{kind} {name}" for kind, (name, _) in plugins.in_use(cfg).items() if kind in ("model", "loss")]
