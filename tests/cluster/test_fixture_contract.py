"""The `slurm_cluster` fixture's contract: skip (with the reason) only when not root; under CI=true,
or when the cluster cannot start, the Slurm tests FAIL instead of passing silently.

Each case runs one real cluster test (tests/real_cluster/test_cluster.py) in a child pytest, so the
fixture under test is the one every Slurm test uses. "Not root" is simulated in the child by
replacing os.geteuid (dropping to a real user would need that user to read the checkout, which a
clone under /root does not allow). No case touches a running cluster: the "non-root" child stops
before slurm-up, and the root child's slurm-up refuses its state dir before doing anything.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster import harness

TARGET = "tests/real_cluster/test_cluster.py::test_shape_nodes_partitions_gres_accounting"


def _child_pytest(env_updates: dict[str, str], as_non_root: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "PYTEST_ADDOPTS", "HPCTRAIN_SLURM_DIR"}}
    env.update(env_updates)
    args = ["-p", "tests.cluster.fixtures", "-p", "no:cacheprovider", "-rsfE", "-q", TARGET]
    code = "import os, sys, pytest\n"
    if as_non_root:
        code += "os.geteuid = lambda: 65534\n"
    code += f"sys.exit(pytest.main({args!r}))\n"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=harness.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_not_root_skips_with_the_reason() -> None:
    proc = _child_pytest({}, as_non_root=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 skipped" in out, out
    assert harness.ROOT_REASON in out, out


def test_not_root_under_ci_fails() -> None:
    proc = _child_pytest({"CI": "true"}, as_non_root=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert harness.ROOT_REASON in out, out


def test_a_cluster_that_cannot_start_fails_not_skips() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("slurm-up needs root; CI runs as root", pytrace=False)
        pytest.skip("slurm-up needs root: run as root")
    # slurm-up refuses a state dir whose unix-socket paths would be too long: a start failure that
    # happens before anything is touched.
    proc = _child_pytest({"HPCTRAIN_SLURM_DIR": "/tmp/" + "x" * 120}, as_non_root=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "the local Slurm cluster did not start" in out and "state dir path too long" in out, out
