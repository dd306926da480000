"""Plug-in names: a data set, model or loss of the user's own, named by its import path in the job
(``model: {name: "mylab.models:build", args: {width: 32}}``). Only what needs no import of a plug-in: the
syntax the schema checks when the job is read, and which plug-ins a ``train:`` section names. Importing them
and binding their arguments is :mod:`hpc_train.plugin_loading`; the ``--dry-run`` probe, above both config and
the trainer, is :mod:`hpc_train.plugin_probe`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*:{_IDENTIFIER}(?:\.{_IDENTIFIER})*\Z")
"""``package.module:function`` (the attribute may be dotted: ``module:Class.build``)."""


def is_import_path(name: str) -> bool:
    return bool(IMPORT_PATH.match(name))


def in_use(train: Any) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """The plug-ins a ``train:`` section names: {kind: (import path, args)}."""
    sections = {"data": train.data, "model": train.model, "loss": train.loss}
    return {kind: (s.name, s.args) for kind, s in sections.items() if is_import_path(s.name)}
