"""Requeue a running job away from bad nodes — from inside that job — without ever leaving it held.

Slurm takes ``scontrol update ExcNodeList`` only for a pending job, so a running one does ``scontrol requeuehold``,
the update, then ``scontrol release``. The catch (issue 26): right after ``requeuehold`` Slurm ends the batch step,
sending SIGTERM to every process of it, and an ``scontrol update`` or ``release`` running at that moment died with
it (exit -15, no output), leaving the job ``PENDING Reason=job_requeued_in_held_state`` for good. So:

* every call here runs with SIGTERM ignored (:func:`sigterm_ignored`: the disposition is set in this process and
  inherited by the children through exec; scontrol installs no SIGTERM handler of its own) and in its own session.
  Which processes Slurm signals depends on the site's ``ProctrackType``: ``proctrack/linuxproc`` (the test
  harness) walks the step's process tree, ``proctrack/cgroup`` (most sites) every process of the step's cgroup,
  ``proctrack/pgid`` the step's process group. A new session escapes only the last; an ignored SIGTERM holds for
  all three. The SIGKILL that follows ``KillWait`` seconds later (30 by default, 5 on the harness) cannot be
  ignored by anything, so the sequence has a deadline well inside ``KillWait`` (:func:`deadline_s`);
* every call is checked against ``scontrol show job`` (held, ``ExcNodeList`` set, released) rather than trusted by
  its exit code, and repeated until it shows or the deadline passes;
* the job is released whatever happened to the exclusion; what could not be done is said in the
  :class:`RequeueOutcome` (the watchdog writes it into the batch log and the run's state, which ``status`` shows).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..hostlist import expand

HELD_REASONS = frozenset({"job_requeued_in_held_state", "JobHeldUser", "JobHeldAdmin"})
"""``scontrol show job``'s Reason of a held job (requeuehold: the first; ``scontrol hold``: the others)."""
DEFAULT_KILL_WAIT_S = 30
"""slurm.conf(5)'s default KillWait: the seconds between the step's SIGTERM and its SIGKILL."""
RETRY_PAUSE_S = 0.2


@dataclass(frozen=True)
class RequeueOutcome:
    """What a requeue did: ``requeued`` (the job will run again), ``excluded`` (the nodes now in its
    ExcNodeList), ``held`` (it is still held: nothing here could release it) and ``problem`` (why the nodes are
    not excluded or the job not released; empty when all went as asked)."""

    job_id: str
    requeued: bool
    excluded: tuple[str, ...] = ()
    held: bool = False
    problem: str = ""

    @property
    def message(self) -> str:
        """One line for the batch log."""
        if not self.requeued:
            return f"job {self.job_id} not requeued: {self.problem}"
        text = f"requeued job {self.job_id}" + (f", excluding {','.join(self.excluded)}" if self.excluded else "")
        return text + (f" ({self.problem})" if self.problem else "")


@contextlib.contextmanager
def sigterm_ignored() -> Iterator[None]:
    """SIGTERM ignored in this process, and so in every child it starts (module docstring)."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run_shielded(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    """One call that the step's SIGTERM cannot end (call it under :func:`sigterm_ignored`); a call that could not
    start or did not answer in time reads as a failure with the reason in its stderr."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=max(timeout_s, 0.5), check=False,
                              start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(list(argv), 1, "", str(exc))


def said(result: subprocess.CompletedProcess) -> str:
    """What a failed call said, or how it ended when it said nothing (a killed call prints nothing)."""
    text = (result.stderr or result.stdout or "").strip()
    if text:
        return text.splitlines()[-1]
    if result.returncode < 0:
        return f"killed by signal {-result.returncode}, no output"
    return f"exit {result.returncode}, no output"


def job_fields(text: str) -> dict[str, str]:
    """``scontrol show job``'s ``Key=Value`` words (values without spaces: the ones read here)."""
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def is_held(fields: dict[str, str]) -> bool:
    return fields.get("Reason") in HELD_REASONS or fields.get("JobState") == "REQUEUE_HOLD"


def excluded_nodes(fields: dict[str, str]) -> list[str]:
    value = fields.get("ExcNodeList", "(null)")
    return expand(value) if value not in ("", "(null)") else []


def kill_wait_s(config_text: str) -> int:
    """``KillWait`` from ``scontrol show config`` (``KillWait = 5 sec``), Slurm's default when absent."""
    m = re.search(r"^KillWait\s*=\s*(\d+)", config_text, re.M)
    return int(m.group(1)) if m else DEFAULT_KILL_WAIT_S


def deadline_s(kill_wait: int) -> float:
    """How long the calls after requeuehold may take: inside KillWait, with a second to spare for the batch
    script to record the outcome."""
    return max(2.0, min(20.0, kill_wait - 1.0))


class _Scontrol:
    """The calls, with SIGTERM ignored, until ``deadline`` (time.monotonic)."""

    def __init__(self, job_id: str, deadline: float, run: Callable[[Sequence[str], float], subprocess.CompletedProcess]):
        self.job_id, self.deadline, self.run = job_id, deadline, run

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def call(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(["scontrol", *args], min(10.0, self.left_s()))

    def show(self) -> dict[str, str] | None:
        result = self.call("show", "job", self.job_id)
        return job_fields(result.stdout) if result.returncode == 0 else None

    def until(self, act: Callable[[], subprocess.CompletedProcess], done: Callable[[dict[str, str]], bool]) -> tuple[bool, str]:
        """Act, then check with ``show job``; again until it shows or the deadline passed. (ok, what failed last)."""
        last = ""
        while True:
            result = act()
            fields = self.show()
            if fields is not None and done(fields):
                return True, ""
            last = said(result) if result.returncode != 0 else "scontrol show job did not show it"
            if self.left_s() <= RETRY_PAUSE_S:
                return False, last
            time.sleep(RETRY_PAUSE_S)


def requeue_excluding(job_id: str, bad_nodes: Sequence[str], *, kill_wait: int | None = None,
                      run: Callable[[Sequence[str], float], subprocess.CompletedProcess] = run_shielded) -> RequeueOutcome:
    """requeuehold ``job_id``, set its ExcNodeList to its own exclusions and ``bad_nodes``, release it (module
    docstring). Never returns with the job held by this call unless Slurm refused every release until the
    deadline (then ``held`` says so)."""
    with sigterm_ignored():
        if kill_wait is None:
            kill_wait = kill_wait_s(run(["scontrol", "show", "config"], 10.0).stdout)
        held = run(["scontrol", "requeuehold", job_id], 10.0)
        calls = _Scontrol(job_id, time.monotonic() + deadline_s(kill_wait), run)
        if held.returncode != 0:  # a requeuehold that Slurm did (its answer lost) is still a hold to release
            fields = calls.show()
            if fields is None or not is_held(fields):
                return RequeueOutcome(job_id, False, problem=f"scontrol requeuehold {job_id} failed: {said(held)}")
        problems, excluded = [], []
        wanted = list(dict.fromkeys(bad_nodes))
        if wanted:
            fields = calls.show() or {}
            names = list(dict.fromkeys([*excluded_nodes(fields), *wanted]))
            ok, why = calls.until(lambda: calls.call("update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}"),
                                  lambda f: set(names) <= set(excluded_nodes(f)))
            if ok:
                excluded = names
            else:
                problems.append(f"ExcNodeList not updated, {','.join(wanted)} may be used again: {why}")
        # Released whatever happened above: a held job never runs again by itself.
        calls.deadline = max(calls.deadline, time.monotonic() + 2.0)
        ok, why = calls.until(lambda: calls.call("release", job_id), lambda f: not is_held(f))
        if not ok:
            problems.append(f"scontrol release {job_id} failed, the job is still held (release it with "
                            f"`scontrol release {job_id}`): {why}")
        return RequeueOutcome(job_id, True, tuple(excluded), held=not ok, problem="; ".join(problems))
