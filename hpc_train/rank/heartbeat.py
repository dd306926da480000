"""Progress heartbeats: each rank says how far it got, in the run directory every node sees, for the launcher's
watchdog (:mod:`hpc_train.runs.liveness` reads them) and ``hpc-train status``. Torch-free, stdlib only.

A rank's record is ``<run dir>/ranks/rank-<R>.progress`` (JSON: rank, host, pid, the launch's instance, a beat
counter, step, epoch, phase, wall time). The trainer refreshes it where the ranks already meet — every
``preempt_check_every_steps`` and at each epoch end — and around evaluation, checkpoint writes and data staging;
your own command calls :func:`heartbeat` (``hpc_train.dist.heartbeat``). Nothing here synchronises ranks, and a
refresh writes the file only when :func:`write_interval_s` has passed since the last write
(one small write + rename per rank every few seconds, never one per step); in between it is a clock read.

:func:`install_stack_dump` registers :mod:`faulthandler` on :data:`DUMP_SIGNAL` (SIGURG, ignored by default, used
neither by the preemption contract nor by NCCL), so the watchdog can have every rank that still runs write its
Python stacks into its log before the run is ended.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..runs import rundir
from ..runs.liveness import DUMP_SIGNAL, PROGRESS_FILE  # the reader's contract: where the record is, what dumps stacks

HANG_TIMEOUT_ENV = "HPC_TRAIN_HANG_TIMEOUT_S"
"""Set by the batch script and the local launcher: the job's ``slurm.hang_timeout_s`` (the write interval follows it)."""


def write_interval_s(hang_timeout_s: float) -> float:
    """Least time between two writes of a rank's record: a twentieth of the hang timeout, 1 to 30 s (30 s when
    the watchdog is off), so a record is always far fresher than ``status``'s stall threshold (a third of it)."""
    if hang_timeout_s <= 0:
        return 30.0
    return min(30.0, max(1.0, hang_timeout_s / 20))


def install_stack_dump() -> bool:
    """All threads' Python stacks to stderr (the rank's log) on :data:`DUMP_SIGNAL`; False where it cannot be."""
    try:
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    except (ValueError, OSError, AttributeError, RuntimeError):  # no usable stderr (a closed or odd stream)
        return False
    return True


class Heartbeat:
    """One rank's progress record (see the module docstring)."""

    def __init__(self, run_dir: Path | str, rank: int, *, local_rank: int | None = None, host: str | None = None,
                 interval_s: float | None = None, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.path = Path(run_dir) / PROGRESS_FILE.format(rank=rank)
        self.instance, self.restart = rundir.instance_of(env)
        timeout = float(env.get(HANG_TIMEOUT_ENV) or 0)
        self.interval_s = write_interval_s(timeout) if interval_s is None else interval_s
        self.fixed = {"rank": rank, "local_rank": local_rank, "host": host or socket.gethostname(),
                      "pid": os.getpid(), "instance": self.instance, "restart": self.restart,
                      "job_id": env.get("SLURM_JOB_ID") or None}
        self.beats = 0
        self.written_at = -1e18
        self.last: dict[str, Any] = {}

    def beat(self, *, step: int, epoch: int | None = None, phase: str = "train", force: bool = False) -> bool:
        """Progress: step ``step`` (of epoch ``epoch``) in ``phase``. Written when forced (the first beat, the end)
        or when the write interval has passed; returns whether it was written. Never raises (a full disk or a
        vanished run directory must not end training)."""
        self.beats += 1
        self.last = {"beat": self.beats, "step": int(step), "epoch": epoch, "phase": phase}
        now = time.monotonic()
        if not force and now - self.written_at < self.interval_s:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            record = {**self.fixed, **self.last, "time": time.time(), "interval_s": self.interval_s}
            rundir.write_text_atomic(self.path, json.dumps(record) + "\n")
        except OSError:
            return False
        self.written_at = now
        return True


_current: Heartbeat | None = None


def start(run_dir: Path | str, rank: int, *, local_rank: int | None = None, host: str | None = None) -> Heartbeat:
    """This process's heartbeat (the trainer sets it up once its rank is known); the stack dump is registered."""
    global _current
    install_stack_dump()
    _current = Heartbeat(run_dir, rank, local_rank=local_rank, host=host)
    return _current


def beat(*, step: int, epoch: int | None = None, phase: str = "train", force: bool = False) -> bool:
    """Refresh this process's heartbeat, if it has one (:func:`start`, :func:`heartbeat`); else nothing."""
    return _current.beat(step=step, epoch=epoch, phase=phase, force=force) if _current is not None else False


def heartbeat(step: int, *, epoch: int | None = None, phase: str = "train") -> bool:
    """Your own command's progress (``from hpc_train.dist import heartbeat``; docs/commands.md): call it every few
    steps with the global step. The first call arms the launcher's watchdog for this rank (and registers the
    stack dump); without any call the watchdog stays off for your job. Outside an hpc-train launch (no
    ``HPC_TRAIN_RUN_DIR``) it does nothing and returns False."""
    if _current is None:  # start() sets it
        run_dir = os.environ.get(rundir.RUN_DIR_ENV)
        if not run_dir:
            return False
        rank = int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)
        local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
        start(run_dir, rank, local_rank=int(local) if local else None)
    return beat(step=step, epoch=epoch, phase=phase)


def reset() -> None:
    """Forget this process's heartbeat (tests)."""
    global _current
    _current = None
