"""The plug-in probe of ``submit --dry-run``: import every plug-in a ``train:`` section names, bind the call the
trainer will make to its signature, and call a loss plug-in on a small batch, before anything is queued.

It sits above both :mod:`hpc_train.config` (which only checks the names) and the trainer (whose loss adapter
it calls, torch imported only then), so config knows nothing of ``train/``. One function, from the train
section to the lines the dry run prints, errors as :class:`~hpc_train.errors.ConfigError` (exit 2): the shape
that lets it run in a child process later (the user's modules are imported here).
"""

from __future__ import annotations

from typing import Any

from .config.plugins import in_use
from .plugin_loading import KINDS, check_arguments, load

_FIXED_CLASSES = {"cifar10-lt": 10, "cifar100-lt": 100, "digits-lt": 10}


def probe_counts(train: Any) -> list[int] | None:
    """Training images per class for calling a plug-in loss before the data is read: the long tail of the
    data config (LDAM-DRW's profile from 100 images) where the class count is known without the data, else
    None (a list file, an ImageFolder or a plug-in data set tells its classes only when read)."""
    data = train.data
    classes = data.num_classes if data.name == "synthetic-lt" else _FIXED_CLASSES.get(data.name)
    if not classes:
        return None
    factor = max(1.0, float(data.imbalance_factor))
    return [max(1, int(100 * factor ** (-i / max(1, classes - 1)))) for i in range(classes)]


def _call_loss(train: Any) -> str:
    """The loss plug-in called on a probe batch (torch imported here, as the plug-in's own module does)."""
    counts = probe_counts(train)
    if counts is None:
        return "not called here (the data set tells its classes when read: train --dry-run calls it)"
    try:
        from .train.model.losses import probe_plugin_loss
    except ImportError:
        return "not called here (no torch: train --dry-run on a compute node calls it)"
    return probe_plugin_loss(train.loss, counts)


def probe_plugins(train: Any) -> list[str]:
    """Import every plug-in of a ``train:`` section and check its arguments, and call a loss plug-in on a small
    batch (it must give per-sample values); one line per plug-in, ConfigError for the first that fails."""
    lines = []
    for kind, (name, args) in in_use(train).items():
        function = load(name, kind)
        check_arguments(function, kind, args, name)
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
        checked = f"; {_call_loss(train)}" if kind == "loss" else ""
        lines.append(f"plug-in {kind} {name}({shown}): imports, arguments match; returns {KINDS[kind].returns}"
                     f"{checked}")
    return lines
