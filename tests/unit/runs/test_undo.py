"""runs/undo.py: what a submission creates is removed again when it fails — only what it created, newest first —
and an impossible path is a ConfigError (exit 2) that undoes the rest."""

from __future__ import annotations

import pytest

from hpc_train.errors import ConfigError
from hpc_train.runs.undo import Created


def test_undo_removes_what_was_made_and_keeps_what_was_there(tmp_path):
    (tmp_path / "runs").mkdir()
    kept = tmp_path / "runs" / "notes.txt"
    kept.write_text("mine")
    created = Created()
    run_dir = created.mkdir(tmp_path / "runs" / "job" / "42" / "logs").parent
    created.write(run_dir / "run.json", "{}")
    created.write(kept, "overwritten")  # existed before: never removed
    created.link(run_dir / "job.sbatch", tmp_path / "runs" / "notes.txt")
    assert (run_dir / "job.sbatch").readlink().as_posix() == "../../notes.txt"  # relative, like the sweep's
    created.undo()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["notes.txt"]
    assert created.paths == []


def test_a_directory_something_else_filled_meanwhile_stays(tmp_path):
    created = Created()
    group = created.mkdir(tmp_path / "job")
    (group / "other-run").mkdir()  # another submission's, made after ours
    created.undo()
    assert (group / "other-run").is_dir()


def test_an_impossible_directory_is_exit_2_and_undoes_the_rest(tmp_path):
    created = Created()
    created.mkdir(tmp_path / "made")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match=r"^cannot create .*a-file/run: .*; choose another runs directory"):
        created.mkdir(tmp_path / "a-file" / "run")
    assert not (tmp_path / "made").exists()


def test_an_impossible_write_is_exit_2_and_undoes_the_rest(tmp_path):
    created = Created()
    run_dir = created.mkdir(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^cannot write .*missing/run\.json"):
        created.write(run_dir / "missing" / "run.json", "{}")
    assert not run_dir.exists()
