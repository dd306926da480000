"""Fixtures of the training tests (CPU only; torch is imported by the tests that need it)."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True)
def _isolated_site(isolated_launch_env):
    """Every training test: see tests/conftest.py::isolated_launch_env."""


@pytest.fixture
def restore_signals():
    """main() installs USR2/TERM handlers; give the pytest process its own back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    from hpc_train.rank import preempt

    preempt.reset()
