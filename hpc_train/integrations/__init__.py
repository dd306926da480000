"""Adapters for training libraries that run under hpc-train (issue 27): each imports its library, and torch, at
import time, so nothing of the CLI's path imports them (tests/unit/test_import_graph.py holds the rule)."""
