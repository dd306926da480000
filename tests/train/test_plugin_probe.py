"""A loss plug-in that gives one value instead of per-sample values is exit 2 at --dry-run, as the docs promise
(issue 19, item 9): both dry runs call it on a probe batch, as the trainer will."""

from __future__ import annotations

import sys

import pytest

from tests.cli_helpers import assert_refused, cli

from .helpers import DIGITS_QUICK, clean_env, write_job
from .test_plugins import train, write_package

pytest.importorskip("torch")


def test_a_scalar_loss_fails_both_dry_runs(tmp_path):
    write_package(tmp_path)
    job = write_job(tmp_path / "job.yaml", {**DIGITS_QUICK, "loss": {"name": "labplug.models:mean_loss"}, "epochs": 1})
    plan = train(job, "--dry-run", cwd=tmp_path)
    assert plan.returncode == 2 and "must return per-sample values of shape (4,)" in plan.stderr, plan.stderr
    assert "got ()" in plan.stderr and "Traceback" not in plan.stderr and "hpc-train plan" not in plan.stdout
    submitted = cli("submit", "--cluster", "local", str(job), "--dry-run", cwd=tmp_path, env=clean_env(tmp_path))
    assert_refused(submitted, "must return per-sample values of shape (4,)")
    assert not (tmp_path / "runs").exists()


def test_the_dry_run_line_says_what_was_called(tmp_path, monkeypatch):
    from hpc_train.config import NO_SITE, plugins, resolve

    write_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    spec = resolve(None, site=NO_SITE, sets=["train.loss.name=labplug.models:scaled_ce"]).spec
    (line,) = plugins.check(spec.train)
    assert line.endswith("called on 4 x 10 logits: per-sample values of shape (4,)")
    listed = resolve(None, site=NO_SITE, sets=["train.loss.name=labplug.models:scaled_ce", "train.data.name=list",
                                               "train.data.root=/data", "train.data.train_list=t.txt",
                                               "train.data.test_list=v.txt"]).spec
    assert "not called here (the data set tells its classes when read" in plugins.check(listed.train)[0]
