"""pytest plugin: the session-wide local Slurm cluster.

Register it once for the whole test run, in the top-level ``tests/conftest.py``::

    pytest_plugins = ["tests.cluster.fixtures"]

Then any test takes the ``slurm_cluster`` fixture (a ``harness.ClusterInfo``):

* not root: the test is skipped, saying why (under ``CI=true`` it fails instead: CI runs as root,
  so a missing prerequisite there is an error, never a silent skip);
* root: ``tests/cluster/slurm-up`` runs once per session (it returns at once when a cluster is
  already up, e.g. from ``make slurm-up``); a cluster that does not start FAILS the test with the
  script's output and the daemon log tails (it is never skipped);
* ``SLURM_CONF`` is set in ``os.environ`` for the session, so code under test that calls sbatch,
  squeue or submitit finds the cluster;
* at session end the cluster is stopped only if this session started it (a developer's
  ``make slurm-up`` cluster survives), and then ``check-clean`` must find nothing left behind.

The Slurm version is ``HPCTRAIN_SLURM_VERSION`` (22.05 by default; 24.11 and 26.05 run from a chroot,
tests/cluster/versions.sh); on those the session's PATH starts with the version's client wrappers. The
submission lifecycle, torch-free (the chroots hold no torch), is marked ``lifecycle``: CI runs it on 24.11
and 26.05 (``HPCTRAIN_SLURM_VERSION=24.11 pytest -m lifecycle tests/real_cluster``), the whole suite on 22.05.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster import harness


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the local Slurm cluster (root; tests/cluster/slurm-up)")
    config.addinivalue_line(
        "markers", "lifecycle: the torch-free submission lifecycle, run on every Slurm version the harness has"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `pytest -m "not slurm"` deselects every test that needs the cluster.
    for item in items:
        if {"slurm_cluster", "slurm_cluster_3"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
    # The tests on the 3-node shape run last, together (in their files' order): the cluster changes shape once
    # per session instead of once per module (each change about 12 s each way on 2 cores).
    items.sort(key=lambda item: "slurm_cluster_3" in getattr(item, "fixturenames", ()))


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


THIRD_NODE_SHAPE = {"HPCTRAIN_SLURM_NODES": "3", "HPCTRAIN_SLURM_MAX_ARRAY_SIZE": "10"}
"""The shape of ``slurm_cluster_3``: a third node (requeue around a bad node) and MaxArraySize 10 (sweeps split)."""


@pytest.fixture(scope="session")
def slurm_cluster_3(slurm_cluster: harness.ClusterInfo) -> Iterator[harness.ClusterInfo]:
    """The cluster restarted with :data:`THIRD_NODE_SHAPE` for the tests that need it (about 12 s; they run last,
    :func:`pytest_collection_modifyitems`), and restarted in its default 2-node shape after them (a developer's
    ``make slurm-up`` cluster relies on it) unless the cluster is stopped right after the session anyway."""
    mp = pytest.MonkeyPatch()
    for key, value in THIRD_NODE_SHAPE.items():
        mp.setenv(key, value)
    try:
        info = harness.start_cluster()
        assert len(info.nodes) == 3, info.nodes
        yield info
    finally:
        mp.undo()
        if not _stopped_after_the_session(slurm_cluster):
            restored = harness.start_cluster()
            if len(restored.nodes) != 2:
                pytest.fail(f"the 2-node shape was not restored: {restored.nodes}", pytrace=False)


STOPPED_AFTER_TESTS = "HPCTRAIN_SLURM_STOPPED_AFTER_TESTS"
"""Set to 1 by a caller that stops the cluster once the tests end (.ci/run): the 3-node shape is left as it is."""


def _stopped_after_the_session(cluster: harness.ClusterInfo) -> bool:
    """Whether the cluster is stopped right after this session — by :func:`slurm_cluster` (this session started
    it) or by the caller (:data:`STOPPED_AFTER_TESTS`) — so a restart in the 2-node shape first (about 10 s) would be
    for nothing (slurm-down stops any shape)."""
    return cluster.started or os.environ.get(STOPPED_AFTER_TESTS) == "1"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[harness.ClusterInfo]:
    if os.geteuid() != 0:
        if _in_ci():
            pytest.fail(f"{harness.ROOT_REASON}; CI=true runs as root, so this is an error", pytrace=False)
        pytest.skip(harness.ROOT_REASON)
    try:
        info = harness.start_cluster()
    except (harness.ClusterError, OSError) as exc:
        pytest.fail(f"the local Slurm cluster did not start (tests/cluster/slurm-up):\n{exc}", pytrace=False)

    if info.slurm_version != harness.requested_version():
        pytest.fail(f"Slurm {info.slurm_version} is up, {harness.requested_version()} was asked for", pytrace=False)
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", info.slurm_conf)
    mp.setenv("PATH", info.env["PATH"])  # this version's client commands (wrappers into its chroot) first
    try:
        yield info
    finally:
        mp.undo()
        if info.started:
            harness.stop_cluster()
            # Only this cluster's remains: in CI, .ci/run checks the whole machine after slurm-down.
            clean, report = harness.check_clean(ours=not _in_ci())
            if not clean:
                pytest.fail(f"slurm-down left things behind:\n{report}", pytrace=False)
