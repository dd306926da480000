"""Shared test setup: the session-wide local Slurm cluster fixture (tests/cluster/fixtures.py)."""

pytest_plugins = ["tests.cluster.fixtures"]
