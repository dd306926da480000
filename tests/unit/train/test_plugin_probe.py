"""A loss plug-in that gives one value instead of per-sample values is exit 2 at --dry-run, as the docs promise
(issue 19, item 9): both dry runs call it on a probe batch, as the trainer will. The probe's own lines are tested
in tests/unit/test_plugin_probe.py."""

from __future__ import annotations

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

