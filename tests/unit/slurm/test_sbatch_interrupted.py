"""Ctrl-C while sbatch runs: what sbatch said is printed, the job sbatch queued is named (and cancelled) or the user
is told it may be queued and how to look, exit 130, no traceback, nothing written. Real processes: ``hpc-train
submit`` in a fresh interpreter, a stand-in sbatch on PATH (tests/conftest.py StubSlurm) that writes to stderr and
waits, SIGINT to the CLI only (as a script or a test would send it; a terminal sends it to sbatch too)."""

import os
import shutil
import signal
import subprocess
import sys
import time

from tests.cli_helpers import tree

SBATCH_WAITING = """#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_SLURM/sbatch.argv"
echo "sbatch: warning: the controller is slow to answer" >&2
{on_interrupt}
echo $$ > "$STUB_SLURM/sbatch.started"
{wait}
"""
DEADLINE_S = 120  # a fresh interpreter's start and the submission on 2 busy cores


def _end_stand_in(started):
    """Kill the stand-in sbatch if it still runs (the old code left it behind); whether it did."""
    try:
        pid = int(started.read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
        alive = b"sbatch" in command or b"sleep" in command
    except (OSError, ValueError):
        return False
    if alive:
        os.kill(pid, signal.SIGKILL)
    return alive


def _interrupted_submit(tmp_path, stub_slurm, sbatch_text):
    (stub_slurm.bin / "sbatch").write_text(sbatch_text)
    before = tree(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "hpc_train.cli", "submit"], cwd=tmp_path, text=True,
                            env=stub_slurm.env(HOME=str(tmp_path)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = stub_slurm.state / "sbatch.started"
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not started.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "sbatch was never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        stand_in_alive = _end_stand_in(started)
    assert not stand_in_alive, "the interrupted sbatch was left running"
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err
    assert "sbatch: warning: the controller is slow to answer" in err, err
    assert tree(tmp_path) == before, "an interrupted submission leaves no run directory and no submitit files"
    return err


def test_ctrl_c_while_sbatch_runs_says_what_sbatch_said_and_that_the_job_may_be_queued(tmp_path, stub_slurm):
    # sbatch ends on the SIGINT passed on to it, printing no job id: the job may or may not be queued.
    err = _interrupted_submit(tmp_path, stub_slurm, SBATCH_WAITING.format(
        on_interrupt="", wait=f"exec {shutil.which('sleep')} 300"))
    assert "may be queued" in err and "squeue --me --name digits-lt-demo" in err, err
    assert stub_slurm.calls("scancel") == []
    assert len(err.strip().splitlines()) == 2, err  # sbatch's line and ours


def test_ctrl_c_after_sbatch_queued_the_job_names_it_and_cancels_it(tmp_path, stub_slurm):
    # sbatch had sent the job: on SIGINT it prints its id (a site's wrapper, or the last instant of sbatch).
    err = _interrupted_submit(tmp_path, stub_slurm, SBATCH_WAITING.format(
        on_interrupt="trap 'echo \"Submitted batch job 4243\"; exit 0' INT",
        wait=f"while :; do {shutil.which('sleep')} 0.1; done"))
    assert "sbatch had queued job 4243; scancel was asked to cancel it" in err and "could not be cancelled" not in err, err
    assert stub_slurm.calls("scancel") == ["4243"]
