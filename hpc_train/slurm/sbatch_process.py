"""One run of ``sbatch`` whose output is ours to the end, Ctrl-C included.

submitit runs sbatch through its ``CommandFunction``, which keeps sbatch's stderr in a local buffer: a Ctrl-C while
sbatch ran lost what sbatch had said, and whether it had queued the job. Here, while sbatch runs, a Ctrl-C is passed
on to sbatch (SIGINT, as a terminal's Ctrl-C does to its whole process group: a script or a test may have signalled
only us) and sbatch is read to its end; then :class:`SbatchInterrupted` carries what it wrote and the job id it
printed, if any. The interrupt is handled by a signal handler, not by catching KeyboardInterrupt, so no moment of
starting sbatch (between fork and ``communicate``) can lose the child or its output. Torch-free, stdlib only.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from typing import Any

STOP_WAIT_S = 10.0
"""How long an interrupted sbatch gets to end after our SIGINT before it is killed (a second Ctrl-C kills it at once):
its request to slurmctld takes a few seconds at most on a busy controller."""

_SUBMITTED = re.compile(r"Submitted batch job (\d+)")


class SbatchInterrupted(KeyboardInterrupt):
    """Ctrl-C while sbatch ran: what it wrote, and the id of the job it queued (None: it printed none, so the job
    may or may not be queued). A KeyboardInterrupt still: code that catches only Exception lets it through."""

    def __init__(self, stdout: str, stderr: str) -> None:
        super().__init__("sbatch interrupted")
        self.stdout = stdout
        self.stderr = stderr
        found = _SUBMITTED.search(stdout)
        self.job_id = found.group(1) if found else None


class _PassOnInterrupts:
    """While installed: SIGINT is passed on to the child (once it exists; one that came before is passed on when it
    does), the child is killed after :data:`STOP_WAIT_S` or at a second SIGINT. A SIGINT that was ignored (a
    background job) stays ignored."""

    def __init__(self) -> None:
        self.count = 0
        self.process: subprocess.Popen | None = None
        self.previous: Any = None
        self.installed = False
        self.timer: threading.Timer | None = None

    def __enter__(self) -> "_PassOnInterrupts":
        # Only the main thread receives signals (and may set handlers); elsewhere sbatch simply runs to its end.
        self.installed = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        if self.installed:
            self.previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.installed:
            signal.signal(signal.SIGINT, self.previous)

    def started(self, process: subprocess.Popen) -> None:
        self.process = process
        if self.count:
            self._pass_on()

    def _on_interrupt(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.process is not None:
            self._pass_on()

    def _pass_on(self) -> None:
        process = self.process
        assert process is not None
        if self.count > 1:
            process.kill()
            return
        process.send_signal(signal.SIGINT)
        self.timer = threading.Timer(STOP_WAIT_S, process.kill)
        self.timer.daemon = True
        self.timer.start()


def run_sbatch(argv: list[str]) -> str:
    """Run ``argv`` (sbatch and its file); its stdout. A non-zero exit raises submitit's ``FailedJobError`` with
    sbatch's stderr, as submitit's own runner does (:func:`hpc_train.slurm.queue._sbatch_refused` reads it); a
    Ctrl-C while it ran raises :class:`SbatchInterrupted` once sbatch has ended."""
    from submitit.core.utils import FailedJobError

    with _PassOnInterrupts() as interrupts:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
            interrupts.started(process)
            stdout, stderr = process.communicate()
    if interrupts.count:
        raise SbatchInterrupted(stdout, stderr)
    if process.returncode:
        raise FailedJobError(stderr.strip()) from subprocess.CalledProcessError(process.returncode, argv, stdout,
                                                                                stderr)
    return stdout.strip()
