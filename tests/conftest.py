"""Shared test setup: the session-wide local Slurm cluster fixture (tests/cluster/fixtures.py), a run
index of the test's own (never the user's ~/.local/state), a compile cache of the session's own (never the
user's ~/.cache), and an environment free of the machine's site
file and of launcher variables, for suites that run the trainer."""

import importlib.util
import os
import shutil

import pytest

pytest_plugins = ["tests.cluster.fixtures"]

# What the trainer suites import; without them they skip at import (pytest.importorskip), which in CI would
# pass a run that tested nothing of the trainer.
TRAIN_EXTRA = ("torch", "torchvision", "numpy", "sklearn")


def pytest_configure(config):
    missing = [name for name in TRAIN_EXTRA if importlib.util.find_spec(name) is None]
    if os.environ.get("CI") == "true" and missing:
        raise pytest.UsageError(f"CI=true but {', '.join(missing)} cannot be imported: the trainer suites would "
                                "skip; install the dev extra (make venv)")

LAUNCHER_VARIABLES = ("HPC_TRAIN_RUN_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "SUBMITIT_LOCAL_GLOBALID")


@pytest.fixture
def isolated_launch_env(tmp_path, monkeypatch):
    """No site file from the machine, no run directory or launcher variables from the environment."""
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def own_run_index(tmp_path_factory, monkeypatch):
    """Every test records submitted runs in an index of its own (hpc_train.runs.index)."""
    monkeypatch.setenv("HPC_TRAIN_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory):
    """The session's own XDG cache (hpc_train.render.jinja keeps compiled templates there), never the user's
    ~/.cache; set in os.environ, so the subprocesses a test starts (hpc-train, sbatch scripts) inherit it."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


STUB_TOOL = """#!/bin/bash
# A stand-in Slurm tool: records its argv, prints what the test set for it, exits with the test's code.
name=$(basename "$0")
printf '%s\\n' "$*" >> "$STUB_SLURM/$name.argv"
if [ "$name" = sbatch ] && [ "$1" = --test-only ]; then
    echo "sbatch: Job 4242 to start at 2026-01-01T00:00:00 using 8 processors on nodes gpu01 in partition gpu" >&2
    exit 0
fi
[ -f "$STUB_SLURM/$name.out" ] && cat "$STUB_SLURM/$name.out"
[ -f "$STUB_SLURM/$name.err" ] && cat "$STUB_SLURM/$name.err" >&2
exit "$(cat "$STUB_SLURM/$name.rc" 2>/dev/null || echo 0)"
"""


class StubSlurm:
    """Stand-ins for sbatch, srun, squeue, sacct, scancel, sinfo, sacctmgr: the scheduler faked at the
    subprocess boundary (as submitit's tests do), for what needs no real cluster."""

    TOOLS = ("sbatch", "srun", "squeue", "sacct", "scancel", "sinfo", "sacctmgr")

    def __init__(self, root):
        self.bin = root / "stub-slurm-bin"
        self.state = root / "stub-slurm"
        self.core = root / "core-bin"  # the few tools the stand-ins use; not /usr/bin, which may hold a real srun
        for directory in (self.bin, self.state, self.core):
            directory.mkdir()
        for tool in ("cat", "basename", "bash", "sh"):
            (self.core / tool).symlink_to(shutil.which(tool))
        for tool in self.TOOLS:
            self.install(tool)
        self.answer("sbatch", "Submitted batch job 4242\n")
        self.answer("sinfo", "slurm 22.05.8\n")

    def install(self, tool):
        (self.bin / tool).write_text(STUB_TOOL)
        (self.bin / tool).chmod(0o755)

    def remove(self, tool):
        (self.bin / tool).unlink()

    def answer(self, tool, stdout="", stderr="", rc=0):
        for suffix, value in (("out", stdout), ("err", stderr), ("rc", str(rc))):
            (self.state / f"{tool}.{suffix}").write_text(value)

    def calls(self, tool):
        path = self.state / f"{tool}.argv"
        return path.read_text().splitlines() if path.exists() else []

    def env(self, **extra):
        import os
        import sys
        from pathlib import Path

        path = f"{self.bin}:{Path(sys.executable).parent}:{self.core}"
        keep = {k: v for k, v in os.environ.items() if k in ("HOME", "HPC_TRAIN_STATE_DIR", "LANG", "PYTHONPATH",
                                                                  "XDG_CACHE_HOME")}
        return {**keep, "PATH": path, "STUB_SLURM": str(self.state), **extra}


@pytest.fixture
def stub_slurm(tmp_path_factory):
    return StubSlurm(tmp_path_factory.mktemp("stub"))


@pytest.fixture
def on_stub_path(stub_slurm, monkeypatch):
    """The stand-in Slurm tools first on this process's PATH (for code that runs them itself, not in a child)."""
    env = stub_slurm.env()
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("STUB_SLURM", env["STUB_SLURM"])
    return stub_slurm


@pytest.fixture(scope="module")
def stub_slurm_module(tmp_path_factory):
    return StubSlurm(tmp_path_factory.mktemp("stub"))


@pytest.fixture(scope="module")
def one_intraop_thread():
    """One intra-op thread, as launch.run gives a rank here (train.num_threads): on a busy 2-core machine
    every 2-thread parallel region waits for both threads to be scheduled (BENCHMARKS.md), 10-50x slower.
    Module-wide, so reference weights are made with the thread count the trainer runs with (a
    convolution's reductions split differently over threads: the bits differ)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
