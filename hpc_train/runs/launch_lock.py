"""One launch per run at a time: ``.launch.lock`` in the run directory, flock'ed for the whole life of a launch.
Torch-free, stdlib only.

A submission takes the lock of every run directory it makes or continues, and checks the run's state under it
(``--resume`` of a live run is refused, naming its job and the pid that holds the lock; a refused one puts back
what the file said). A local submission hands the locked file to its runner (an inherited descriptor: the lock is
the open file's, so it passes without a moment unlocked), which holds it until its last launch ended; the ranks and
the guard do not inherit it. A Slurm submission holds it while it queues; from then on the run's record (its job
``queued`` or ``running``, as squeue confirms) says the run is live.

Every new run directory has the (empty) file from its submission (:func:`hpc_train.runs.submission.write_run_files`);
a run made before launch locks gets it from its first continuation, and a refused one removes it again. The file
holds who holds it (``pid``, ``job_id``), for the refusal's words. It is opened without following a symlink, and
only a regular file is locked. A filesystem without flock (some NFS mounts) is said, not worked around: a run that
cannot be locked is not launched.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from . import liveness

LOCK_FILE = ".launch.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds a run's launch lock (as it wrote into the file)."""

    pid: int
    job_id: str


def _open(run_dir: Path) -> tuple[int, bool]:
    """The lock file's descriptor, and whether this call created it."""
    path = Path(run_dir) / LOCK_FILE
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, created = os.open(path, flags), False
    except OSError as exc:
        raise ConfigError(f"cannot open {path}: {exc.strerror or exc} (it must be a regular file, not a link)"
                          ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path} is not a regular file; remove it")
    return fd, created


def read_holder(fd: int) -> Holder | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8", errors="replace"))
        return Holder(pid=int(data["pid"]), job_id=str(data["job_id"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _live_holder(fd: int, wait_s: float = 1.0) -> Holder | None:
    """The holder written in the lock file, once it is a live process: a submission that has just taken the lock
    writes itself in a moment later, and until then the file may still name the previous, ended holder."""
    deadline = time.monotonic() + wait_s
    while True:
        found = read_holder(fd)
        if found is not None and liveness.is_alive(found.pid):
            return found
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def note_holder(fd: int, pid: int, job_id: str) -> None:
    """Write who holds the lock now (the runner, once it was handed the descriptor)."""
    text = json.dumps({"pid": pid, "job_id": job_id}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)


@dataclass
class Held:
    """A run's launch lock, held through ``fd``; ``previous``: what the file said before this holder wrote itself
    in, put back by :meth:`give_up` when the submission is refused after all (it then changed nothing)."""

    fd: int
    previous: bytes
    path: Path
    created: bool
    """The file did not exist (a run made before launch locks): a refusal removes it again."""

    def give_up(self) -> None:
        try:
            if self.created:
                self.path.unlink(missing_ok=True)
            else:
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, self.previous, 0)
        finally:
            os.close(self.fd)


def take(run_dir: Path, run_name: str, job_id: str) -> Held:
    """The run's launch lock (closing its descriptor, or the holder's end, releases it), with this process and
    ``job_id`` written in; a run whose lock is held is refused (exit 2), naming the job and pid that hold it."""
    fd, created = _open(run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _live_holder(fd) if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
        os.close(fd)
        if created:
            (Path(run_dir) / LOCK_FILE).unlink(missing_ok=True)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            who = f"job {holder.job_id}, pid {holder.pid}" if holder else "another submission"
            raise ConfigError(f"{run_name} is live ({who} holds {LOCK_FILE}): wait for it to end, or "
                              f"hpc-train cancel {run_name}") from None
        raise ConfigError(f"cannot lock {Path(run_dir) / LOCK_FILE}: {exc.strerror or exc} (a filesystem without "
                          "flock cannot tell whether the run is live; use a runs directory on one that has it)"
                          ) from None
    held = Held(fd, os.pread(fd, 4096, 0), Path(run_dir) / LOCK_FILE, created)
    note_holder(fd, os.getpid(), job_id)
    return held


def holder(run_dir: Path) -> Holder | None:
    """Who holds the run's lock now; None when nobody does (or the run has no lock file)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return read_holder(fd) or Holder(pid=0, job_id="?")
        return None
    finally:
        os.close(fd)
