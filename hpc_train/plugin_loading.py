"""Loading a plug-in: the callable a job names by its import path (``model: {name: "mylab.models:build"}``),
imported the way the ranks import it, and the call hpc-train makes bound to its signature. Torch-free: the
dry-run's probe (:mod:`hpc_train.plugin_probe`) and the trainer's adapters, each beside its registry
(:func:`hpc_train.train.model.models.build_plugin_model`, :func:`hpc_train.train.model.losses.build_plugin_loss`,
:func:`hpc_train.train.data.datasets.load_plugin_data`), both go through here. The names themselves are checked
when the job is read (:func:`hpc_train.config.plugins.is_import_path`).

Plug-ins are imported from the directory the job was submitted from (the ranks' working directory) and
``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .errors import ConfigError


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


def call(name: str, kind: str, args: Mapping[str, Any], **passed: Any) -> Any:
    """Load the plug-in, check the call binds, and make it: ``function(**passed, **args)``."""
    function = load(name, kind)
    check_arguments(function, kind, args, name)
    return function(**passed, **args)
