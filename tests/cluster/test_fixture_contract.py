"""The `slurm_cluster` fixture's contract: skip (with the reason) only when not root; under CI=true,
or when the cluster cannot start, the Slurm tests FAIL instead of passing silently.

Each case runs one real cluster test (tests/slurm/test_cluster.py) in a child pytest, so the
fixture under test is the one every Slurm test uses. No case touches a running cluster: the
unprivileged child stops before slurm-up, the root child's slurm-up refuses its state dir at once.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster import harness

TARGET = "tests/slurm/test_cluster.py::test_shape_nodes_partitions_gres_accounting"


def _child_pytest(env_updates: dict[str, str], as_nobody: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "PYTEST_ADDOPTS", "HPCTRAIN_SLURM_DIR"}}
    env.update(env_updates, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.cluster.fixtures", "-p", "no:cacheprovider"]
    cmd += ["-rsfE", "-q", TARGET]
    if as_nobody:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    return subprocess.run(
        cmd, cwd=harness.REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def root_only() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("these checks drop from root to nobody; CI runs as root", pytrace=False)
        pytest.skip("these checks drop from root to nobody: run as root")


def test_not_root_skips_with_the_reason(root_only: None) -> None:
    proc = _child_pytest({}, as_nobody=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 skipped" in out, out
    assert harness.ROOT_REASON in out, out


def test_not_root_under_ci_fails(root_only: None) -> None:
    proc = _child_pytest({"CI": "true"}, as_nobody=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert harness.ROOT_REASON in out, out


def test_a_cluster_that_cannot_start_fails_not_skips(root_only: None) -> None:
    # slurm-up refuses a state dir whose unix-socket paths would be too long: a start failure that
    # happens before anything is touched.
    proc = _child_pytest({"HPCTRAIN_SLURM_DIR": "/tmp/" + "x" * 120}, as_nobody=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "the local Slurm cluster did not start" in out and "state dir path too long" in out, out
