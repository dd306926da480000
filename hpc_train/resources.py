"""Where the shipped templates, example jobs and Ansible tree are.

In the source tree (and an editable install) they are the top-level ``templates/``, ``jobs/`` and
``ansible/``; a built wheel carries the same directories as ``hpc_train/_data/<name>`` (setup.cfg maps
them with ``package_dir``, so nothing is copied at build time).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


def templates_dir() -> Path:
    return _shipped("templates")


def jobs_dir() -> Path:
    return _shipped("jobs")


def ansible_dir() -> Path:
    return _shipped("ansible")
