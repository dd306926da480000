"""Plug-ins: a data set, model or loss of the user's own, named by its import path in the job
(``model: {name: "mylab.models:build", args: {width: 32}}``). Torch-free: the names are checked when the job
is read, and ``--dry-run`` imports each plug-in and checks its arguments against its signature here, before
anything is trained; the trainer builds them (:mod:`hpc_train.train.model.plugins`).

Plug-ins are imported the way the ranks import them: from the directory the job was submitted from (the ranks'
working directory) and ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*:{_IDENTIFIER}(?:\.{_IDENTIFIER})*\Z")
"""``package.module:function`` (the attribute may be dotted: ``module:Class.build``)."""


@dataclass(frozen=True)
class Kind:
    """What a plug-in of one kind is called with (keywords, besides the job's ``args``)."""

    key: str
    passed: tuple[str, ...]
    returns: str


KINDS = {
    "data": Kind("train.data", ("config",), "a hpc_train.train.data.datasets.DataSource"),
    "model": Kind("train.model", ("num_classes", "in_channels"),
                  "a feature backbone: an nn.Module with a feature_dim attribute, or (module, feature_dim)"),
    "loss": Kind("train.loss", ("counts",), "loss(logits, target) -> per-sample values of shape (batch,)"),
}


def is_import_path(name: str) -> bool:
    return bool(IMPORT_PATH.match(name))


def load(name: str, kind: str) -> Callable[..., Any]:
    """The callable ``package.module:attr`` names, imported from the submit directory or PYTHONPATH;
    ConfigError (exit 2) naming the key when it cannot be imported or called."""
    key = KINDS[kind].key
    module_name, _, attr = name.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # `hpc-train` (a console script) does not put the working directory there
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module: any error is a configuration error
        raise ConfigError(f"{key}.name: cannot import {module_name!r} ({type(exc).__name__}: {exc}); plug-ins are "
                          "imported from the submit directory or PYTHONPATH") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{key}.name: {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{key}.name: {name} is not callable ({type(target).__name__})")
    return target


def check_arguments(function: Callable[..., Any], kind: str, args: Mapping[str, Any], name: str) -> None:
    """The call the trainer will make binds to the plug-in's signature (missing or unknown arguments)."""
    spec = KINDS[kind]
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to check before the call
    clash = sorted(set(args) & set(spec.passed))
    if clash:
        raise ConfigError(f"{spec.key}.args: {', '.join(clash)} is passed by hpc-train itself; remove it")
    try:
        signature.bind(**{p: None for p in spec.passed}, **args)
    except TypeError as exc:
        raise ConfigError(f"{spec.key}: {name}{signature} cannot be called with {', '.join(spec.passed)} and args "
                          f"{sorted(args)}: {exc}") from None


def in_use(train: Any) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """The plug-ins a ``train:`` section names: {kind: (import path, args)}."""
    sections = {"data": train.data, "model": train.model, "loss": train.loss}
    return {kind: (s.name, s.args) for kind, s in sections.items() if is_import_path(s.name)}


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


def _called(train: Any) -> str:
    """The loss plug-in called on a probe batch (torch imported here, as the plug-in's own module does)."""
    counts = probe_counts(train)
    if counts is None:
        return "not called here (the data set tells its classes when read: train --dry-run calls it)"
    try:
        from ..train.model.plugins import probe_loss
    except ImportError:
        return "not called here (no torch: train --dry-run on a compute node calls it)"
    return probe_loss(train.loss, counts)


def check(train: Any) -> list[str]:
    """Import every plug-in of a ``train:`` section and check its arguments, and call a loss plug-in on a small
    batch (it must give per-sample values); one line per plug-in."""
    lines = []
    for kind, (name, args) in in_use(train).items():
        function = load(name, kind)
        check_arguments(function, kind, args, name)
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
        checked = f"; {_called(train)}" if kind == "loss" else ""
        lines.append(f"plug-in {kind} {name}({shown}): imports, arguments match; returns {KINDS[kind].returns}"
                     f"{checked}")
    return lines
