"""The benchmark references are honest: fed what ours is fed, they compute what ours computes.

CPU, tiny sizes, one thread; torch is imported by the tests themselves.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(isolated_launch_env):
    """Every benchmark-reference test: see tests/conftest.py::isolated_launch_env."""
