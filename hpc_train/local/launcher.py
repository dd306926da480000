"""Running launches of runs on this machine: the sbatch script's counterpart for local runs, and the pack
runner of ``--pack K`` on Slurm. Torch-free; :mod:`hpc_train.local.plan` is its submit side.

A launch:

* records ``running`` in the run's state log, starts the ranks with the rank environment (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT`` of its
  own, ``HPC_TRAIN_RUN_DIR``) plus ``slurm.env``, each logging to ``logs/rank-N.log``;
* ends the others when one rank fails (srun's ``--kill-on-bad-exit``), naming the rank that ended first, by
  the time it ended (the others' "connection closed by peer" is a consequence), with its signal when one killed
  it (SIGKILL: what the out-of-memory killer sends), in ``logs/batch.log`` and in the state log;
* is the ranks' supervisor, as slurmstepd is: each rank leads a process group of its own and gets SIGKILL from
  the kernel when the launcher's thread that started it dies (a parent-death signal), and a guard process
  (:mod:`.guard`) ends every rank's process group and records the failure when the launcher dies without ending
  them (SIGKILL); SIGTERM or SIGINT to the local runner reach the ranks as ``scancel`` does (SIGTERM, the trainer
  checkpoints, SIGKILL after :data:`KILL_WAIT_S`) and the run is recorded ``cancelled``, saying whether the ranks
  checkpointed;
* sends ``slurm.signal`` ``signal_delay_s`` before ``slurm.time`` and ends the ranks at it (locally; under
  Slurm, Slurm does, and the runner forwards the signal to the ranks);
* ends the ranks when the run is cancelled (``hpc-train cancel`` records it; the launcher sees it);
* watches the ranks' heartbeats (``slurm.hang_timeout_s``): when none has advanced for the timeout, the ranks'
  stacks go into the logs, the ranks are killed and the run is recorded failed, naming the rank that stopped
  first (:mod:`.hang_actions`), or launched again from its last checkpoint (``slurm.hang_action: requeue``);
* records the launch's exit code, as the batch script's exit block does; a command that exits 75
  (checkpointed) is launched again, at most ``slurm.max_requeues`` times, as Slurm requeues it.

``pack`` launches run at the same time (``--pack K``: sweep points sharing one allocation, each with its own
run directory, port, logs, checkpoints and state); the others one after another.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import signal
import socket
import subprocess
import threading
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..rank.heartbeat import HANG_TIMEOUT_ENV
from ..rank.preempt import signal_number  # USR2, SIGUSR2 or 12, as the ranks read slurm.signal
from ..runs import liveness, rundir, safe_files
from . import guard as guard_module
from . import hang_actions

POLL_S = 0.2
KILL_WAIT_S = 5.0
"""After SIGTERM, how long ranks get before SIGKILL (Slurm's KillWait)."""


@dataclass(frozen=True)
class Launch:
    """One launch of the plan: which run, how many ranks, and the limits Slurm would enforce."""

    run_dir: str
    run_id: str
    world_size: int
    visible_gpus: int
    time_limit_s: int
    """0: no limit here (under Slurm, Slurm enforces it)."""
    signal: str
    signal_delay_s: int
    env: dict[str, str]
    entry: str = "hpc_train.train"
    """The rank's module: the trainer, or :mod:`hpc_train.command` (the user's command)."""
    requeues: int = 0
    """A launch that exits 75 (checkpointed) runs again, at most this many times (commands; Slurm's requeue)."""
    hang_timeout_s: int = 0
    """The watchdog's timeout (``slurm.hang_timeout_s``); 0: off."""
    hang_requeues: int = 0
    """A hung launch runs again (``slurm.hang_action: requeue``), at most this many restarts in all."""


_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
_received: list[str] = []
_stop: list[str] = []
"""The signal that told the local runner to stop (``SIGTERM``, ``SIGINT``): its launches end their ranks."""

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log(batch_log: Any, text: str) -> None:
    stamp = _dt.datetime.now().strftime("%H:%M:%S")
    batch_log.write(f"{stamp} hpc-train: {text}\n")
    batch_log.flush()


def rank_environment(launch: Launch, rank: int, port: int, instance: str) -> dict[str, str]:
    """What every local rank gets: this environment, slurm.env, and the rank mapping torchrun would give."""
    env = {**os.environ, **launch.env}
    for name in [k for k in env if k.startswith(("SLURM_", "SUBMITIT_"))]:
        del env[name]  # a local run inside an allocation must not take the allocation's variables for its own
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(launch.world_size),
        "LOCAL_WORLD_SIZE": str(launch.world_size), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), rundir.RUN_DIR_ENV: launch.run_dir, rundir.INSTANCE_ENV: instance,
        "HPC_TRAIN_LAUNCHER": "local", "PYTHONUNBUFFERED": "1", HANG_TIMEOUT_ENV: str(launch.hang_timeout_s),
    })
    if launch.visible_gpus:
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(launch.visible_gpus)))
    return env


def _signal_all(procs: Sequence[subprocess.Popen], signum: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass


def _end_all(procs: Sequence[subprocess.Popen], wait_s: float = KILL_WAIT_S) -> None:
    """SIGTERM to the ranks, SIGKILL to their process groups after ``wait_s`` (Slurm's KillWait): nothing of a
    rank (its data workers, a command's own children) is left."""
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    hang_actions.kill_groups(procs)


def _exit_code(returncode: int) -> int:
    """A process's exit status as a shell reports it (killed by signal N: 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


def how_it_ended(returncode: int) -> str:
    """A rank's end as the batch log says it (srun's words for an exit code; a signal named, never "Killed",
    which names the ranks srun itself ended)."""
    if returncode >= 0:
        return f"Exited with exit code {returncode}"
    number = -returncode
    name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
    oom = ", as the out-of-memory killer does" if number == signal.SIGKILL else ""
    return f"ended by {name} (signal {number}{oom})"


class EndOrder:
    """When each rank's process ended, as it happened: a thread per rank waits for it (a poll every
    :data:`POLL_S` would see a rank killed first and the peer that then lost its connection in the same poll)."""

    def __init__(self, procs: Sequence[subprocess.Popen]) -> None:
        self.procs = list(procs)
        self.ended: list[int] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._wait, args=(rank, proc), daemon=True, name=f"rank-{rank}-end")
                         for rank, proc in enumerate(self.procs)]
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        """Until every rank has ended and been counted."""
        for thread in self._threads:
            thread.join()

    def _wait(self, rank: int, proc: subprocess.Popen) -> None:
        proc.wait()
        with self._lock:
            self.ended.append(rank)

    def first_failed(self) -> int | None:
        """The rank that ended first with a failure (not 0, not 75), by when it ended."""
        with self._lock:
            order = list(self.ended)
        return next((r for r in order if self.procs[r].returncode not in (0, rundir.EXIT_CHECKPOINTED)), None)


class FirstFailure(Exception):
    """A rank failed: the one that ended first, and how."""

    def __init__(self, rank: int, returncode: int) -> None:
        super().__init__(f"task {rank}: {how_it_ended(returncode)}")
        self.rank, self.returncode = rank, returncode

    @property
    def code(self) -> int:
        return _exit_code(self.returncode)


class Hung(Exception):
    """The watchdog ended the launch; ``reason`` names the rank that stopped first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _supervise(procs: list[subprocess.Popen], launch: Launch, batch_log: Any, instance: str = "") -> int:
    """Wait for the ranks; the launch's exit code. Raises :class:`FirstFailure` when a rank failed (the launch's
    code is then the first failing rank's, as srun reports it) and :class:`Hung` when the watchdog ended them."""
    run_dir = Path(launch.run_dir)
    started, last_check, signalled = time.monotonic(), 0.0, False
    order = EndOrder(procs)
    watch = liveness.Watch(launch.world_size, launch.hang_timeout_s, instance)
    # Poll every rank each time (a generator in any() stops at the first live one, and a failure of a later
    # rank would go unseen until the earlier ones ended).
    while any([p.poll() is None for p in procs]):
        now = time.monotonic()
        first = order.first_failed()
        if first is not None:
            _log(batch_log, f"error: {socket.gethostname()}: task {first}: {how_it_ended(procs[first].returncode)}")
            _end_all(procs, wait_s=5.0)  # like srun --kill-on-bad-exit
            raise FirstFailure(first, procs[first].returncode)
        if _stop:
            _log(batch_log, f"the local launcher got {_stop[0]}: sending SIGTERM to the ranks (as scancel does), "
                            f"SIGKILL after {KILL_WAIT_S:.0f} s")
            _end_all(procs)
            return max(_exit_code(p.returncode) for p in procs)
        if now - last_check > 0.5:
            last_check = now
            if rundir.read_state(run_dir).state == rundir.CANCELLED:
                _log(batch_log, "cancelled; ending the ranks")
                _end_all(procs)
                return 128 + signal.SIGTERM
            if launch.hang_timeout_s > 0:
                watch.update(liveness.read_beats(run_dir, instance), now)
                ended = [rank for rank, p in enumerate(procs) if p.poll() is not None]
                if watch.hung(now, ended):
                    raise Hung(hang_actions.on_hang(procs, watch, lambda r: run_dir / rundir.RANK_LOG.format(rank=r),
                                                    lambda text: _log(batch_log, text)))
        limited = launch.time_limit_s > 0
        if limited and not signalled and now - started >= launch.time_limit_s - launch.signal_delay_s:
            signalled = True
            number = signal_number(launch.signal)
            _log(batch_log, f"{launch.signal_delay_s} s before the time limit: sending {signal.strsignal(number)} "
                            f"({launch.signal}) to the ranks")
            _signal_all(procs, number)
        if limited and now - started >= launch.time_limit_s:
            _log(batch_log, "time limit reached; ending the ranks")
            _end_all(procs)
            return 128 + signal.SIGTERM
        time.sleep(POLL_S)
    order.join()
    first = order.first_failed()
    if first is not None:
        _log(batch_log, f"error: {socket.gethostname()}: task {first}: {how_it_ended(procs[first].returncode)}")
        raise FirstFailure(first, procs[first].returncode)
    return max(_exit_code(p.returncode) for p in procs)


def _instance(launch: Launch, launches: int) -> tuple[str, int]:
    """The launch's instance id and restart count: a Slurm job's when packed in one (so the ranks' lines and
    Slurm's view agree), else the local run's own count of launches."""
    if os.environ.get("SLURM_JOB_ID"):
        return rundir.instance_of()
    return f"local:{launch.run_id}.{launches}", launches


def _start_ranks(launch: Launch, python: str, cwd: str, port: int, instance: str) -> list[subprocess.Popen]:
    """The ranks, each logging to its file, leading a process group of its own (the watchdog and the guard end
    a rank with its data workers) and dying with the thread that starts them (:mod:`.rank_start` sets that up
    after the fork: no Python code runs in the forked child while this launcher's other threads run)."""
    run_dir = Path(launch.run_dir)
    command = [sys.executable, "-m", "hpc_train.local.rank_start", str(os.getpid()), "--",
               python, "-u", "-m", launch.entry, "--resolved", str(run_dir / rundir.JOB_YAML)]
    procs = []
    for rank in range(launch.world_size):
        with os.fdopen(safe_files.open_append(run_dir / rundir.RANK_LOG.format(rank=rank), within=run_dir), "ab") as rank_log:
            procs.append(subprocess.Popen(command, env=rank_environment(launch, rank, port, instance), cwd=cwd,
                                          stdin=subprocess.DEVNULL, stdout=rank_log, stderr=subprocess.STDOUT,
                                          process_group=0))
    return procs


def _start_guard(launch: Launch, instance: str, restart: int, procs: Sequence[subprocess.Popen]) -> subprocess.Popen:
    """The guard that ends the ranks if this launcher dies first (:mod:`.guard`), told who they are; and the
    ranks' processes in the state log, for ``status`` and ``cancel``."""
    ranks = [liveness.RankProcess(rank, p.pid, liveness.start_ticks(p.pid)) for rank, p in enumerate(procs)]
    guard = subprocess.Popen([sys.executable, "-m", "hpc_train.local.guard", launch.run_dir, instance, str(restart),
                              str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert guard.stdin is not None
    guard.stdin.write("".join(f"{r.rank} {r.pid} {r.start_ticks}\n" for r in ranks))
    guard.stdin.flush()
    rundir.append_event(launch.run_dir, liveness.RANKS_EVENT, writer="launcher", instance=instance, restart=restart,
                        launcher_pid=os.getpid(), ranks=[[r.rank, r.pid, r.start_ticks] for r in ranks])
    return guard


def _release_guard(guard: subprocess.Popen) -> None:
    """The launch ended as it should: the guard leaves without doing anything."""
    try:
        assert guard.stdin is not None
        guard.stdin.write(guard_module.DONE + "\n")
        guard.stdin.close()
    except OSError:
        pass  # the guard was ended by someone: nothing for it to do anyway
    guard.wait()


def _record_first_failure(launch: Launch, failure: FirstFailure, instance: str, restart: int) -> None:
    """The first failing rank, named for the run's state (its own failure line, when it wrote one, says why)."""
    host = socket.gethostname()
    rundir.append_event(launch.run_dir, rundir.FAILED, writer="launcher", instance=instance, restart=restart,
                        rank=failure.rank, host=host, exit_code=failure.code, first_rank=failure.rank,
                        reason=f"rank {failure.rank} on {host}: {how_it_ended(failure.returncode)}")


def _record_stop(launch: Launch, code: int, instance: str, restart: int) -> None:
    """The runner was told to stop (SIGTERM, SIGINT): ``cancelled``, saying whether the ranks checkpointed."""
    outcome = ("the ranks checkpointed (exit 75)" if code == rundir.EXIT_CHECKPOINTED
               else f"the ranks were ended (exit {code})")
    rundir.append_event(launch.run_dir, rundir.CANCELLED, writer="launcher", instance=instance, restart=restart,
                        exit_code=code, reason=f"the local launcher got {_stop[0]}; {outcome}")


def _run_ranks(launch: Launch, python: str, cwd: str, batch_log: Any, instance: str, restart: int,
               port: int) -> tuple[int, str | None]:
    """Start the ranks with their guard, supervise them to their end; (exit code, the hang's reason or None)."""
    procs = _start_ranks(launch, python, cwd, port, instance)
    guard = _start_guard(launch, instance, restart, procs)
    with _live_lock:
        _live.update(procs)
    hung = None
    try:
        code = _supervise(procs, launch, batch_log, instance)
    except Hung as exc:
        hung, code = exc.reason, rundir.EXIT_HUNG
    except FirstFailure as failure:
        _record_first_failure(launch, failure, instance, restart)
        code = failure.code
    finally:
        with _live_lock:
            _live.difference_update(procs)
    _release_guard(guard)
    return code, hung


def run_launch(launch: Launch, python: str, cwd: str) -> int:
    """One launch of one run: the ranks, their logs, and the state lines around them."""
    run_dir = Path(launch.run_dir)
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    with os.fdopen(safe_files.open_append(run_dir / rundir.BATCH_LOG, within=run_dir), "a", encoding="utf-8") as batch_log:
        events = rundir.read_events(run_dir)
        if rundir.fold(events).state == rundir.CANCELLED:
            _log(batch_log, "cancelled before it started")
            return 128 + signal.SIGTERM
        launches = sum(1 for e in events if e.get("event") == rundir.RUNNING and e.get("writer") == "launcher")
        instance, restart = _instance(launch, launches)
        if _stop:
            _log(batch_log, f"the local launcher got {_stop[0]} before this launch started")
            _record_stop(launch, 128 + signal.SIGTERM, instance, restart)
            return 128 + signal.SIGTERM
        rundir.append_event(run_dir, rundir.RUNNING, writer="launcher", instance=instance, restart=restart,
                            job_id=launch.run_id, pid=os.getpid())
        port = _free_port()
        _log(batch_log, f"local launch {launches} of {launch.run_id}: {launch.world_size} rank(s), "
                        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}")
        code, hung = _run_ranks(launch, python, cwd, batch_log, instance, restart, port)
        if _stop:
            _log(batch_log, f"ranks exited with status {code}")
            _record_stop(launch, code, instance, restart)
            return code
        if hung is not None and launches < launch.hang_requeues and not _received_term():
            _log(batch_log, f"hung: launching it again from its last checkpoint (restart {launches + 1} of at most "
                            f"{launch.hang_requeues})")
            rundir.append_event(run_dir, rundir.REQUEUED, writer="watchdog", instance=instance, restart=restart,
                                exit_code=code, reason=hung)
            return run_launch(launch, python, cwd)
        if hung is not None:
            rundir.append_event(run_dir, rundir.FAILED, writer="watchdog", instance=instance, restart=restart,
                                exit_code=code, reason=hung)
        if code != 0 and rundir.read_state(run_dir).state == rundir.PREEMPTED:
            code = rundir.EXIT_CHECKPOINTED
        if code == rundir.EXIT_CHECKPOINTED and launches < launch.requeues and not _received_term():
            _log(batch_log, f"checkpointed (exit 75): launching it again (restart {launches + 1} of at most "
                            f"{launch.requeues})")
            rundir.append_event(run_dir, rundir.REQUEUED, writer="launcher", instance=instance, restart=restart,
                                exit_code=code)
            return run_launch(launch, python, cwd)
        if code == rundir.EXIT_CHECKPOINTED:
            _log(batch_log, f"checkpointed but not requeued; continue with: hpc-train submit --resume {run_dir}")
        _log(batch_log, f"ranks exited with status {code}")
        if rundir.read_state(run_dir).state != rundir.CANCELLED:
            rundir.append_event(run_dir, rundir.EXIT, writer="launcher", instance=instance, restart=restart,
                                exit_code=code)
        return code


def _received_term() -> bool:
    return "TERM" in _received


def received() -> list[str]:
    """The signals the pack runner was sent (names without SIG)."""
    return list(_received)


def run_launches(launches: Sequence[Launch], python: str, cwd: str, pack: int = 1) -> list[int]:
    """Every launch, ``pack`` at a time (each in a thread of its own: they wait on their ranks); exit codes."""
    codes: list[int] = []
    for first in range(0, len(launches), max(1, pack)):
        group = list(launches[first:first + max(1, pack)])
        results = [0] * len(group)

        def one(index: int) -> None:
            results[index] = run_launch(group[index], python, cwd)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(group))]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # join in slices: the main thread must stay free to take signals
                thread.join(0.2)
        codes.extend(results)
    return codes


def forward_signals(names: Sequence[str]) -> None:
    """Under Slurm, the pack runner passes the signals it gets to every rank it started (where Slurm signals
    the whole step the ranks get it twice; the trainer's handler only sets a flag)."""

    def forward(signum: int, _frame: object) -> None:
        _received.append(signal.Signals(signum).name.removeprefix("SIG"))
        with _live_lock:
            procs = list(_live)
        _signal_all(procs, signum)

    for name in dict.fromkeys(names):
        signal.signal(signal_number(name), forward)


def stop_on_signals() -> None:
    """The local runner's SIGTERM and SIGINT: its launches end their ranks as ``scancel`` does and record the run
    ``cancelled``; no later launch of its plan starts (the handler only notes the signal)."""

    def stop(signum: int, _frame: object) -> None:
        _stop.append(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


def launch_for(spec, run_dir: Path, *, under_slurm: bool = False) -> Launch:
    """The launch of one run directory's job (the local launcher's plan, or the pack runner's)."""
    s = spec.slurm
    threads = {"OMP_NUM_THREADS": str(s.cpus_per_task)} if s.pack > 1 else {}
    return Launch(run_dir=str(run_dir), run_id=run_dir.name, world_size=s.ranks_per_node,
                  visible_gpus=0 if under_slurm else s.gpus_per_node,
                  time_limit_s=0 if under_slurm else s.time_min * 60, signal=s.signal,
                  signal_delay_s=s.signal_delay_s, env={**threads, **s.env},
                  entry="hpc_train.command" if spec.command else "hpc_train.train",
                  requeues=s.max_requeues if (spec.command and s.requeue and not under_slurm) else 0,
                  hang_timeout_s=s.hang_timeout_s,
                  hang_requeues=s.max_requeues if (s.hang_action == "requeue" and not under_slurm) else 0)


def as_dict(launch: Launch) -> dict[str, Any]:
    return dataclasses.asdict(launch)
