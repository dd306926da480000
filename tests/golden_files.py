"""The one golden-file check of both golden suites (the sbatch scripts, tests/unit/render/test_render.py; the Ansible role
templates, tests/ansible/test_templates.py). ``HPC_TRAIN_UPDATE_GOLDEN=1`` rewrites the files instead of
comparing (then review ``git diff``); a missing file is written and the test fails, so it is never silently new."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

UPDATE_ENV = "HPC_TRAIN_UPDATE_GOLDEN"


def check_golden(path: Path, text: str, *, how_to_update: str) -> None:
    """``text`` equals the golden file ``path``; ``how_to_update``: the command that regenerates it."""
    updating = os.environ.get(UPDATE_ENV) == "1"
    if updating or not path.exists():
        path.write_text(text)
        if not updating:
            pytest.fail(f"golden file {path} was missing and has been written; review it and commit it")
    expected = path.read_text()
    assert text == expected, (
        f"{path.name} differs from the golden file {path}. If the change is intended, regenerate it with\n"
        f"  {UPDATE_ENV}=1 {how_to_update}\nand review `git diff {path.parent}`."
    )
