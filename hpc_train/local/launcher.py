"""Running launches of runs on this machine: the sbatch script's counterpart for local runs, and the pack
runner of ``--pack K`` on Slurm. Torch-free; :mod:`hpc_train.local.plan` is its submit side.

A launch:

* records ``running`` in the run's state log, starts the ranks with the rank environment (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT`` of its
  own, ``HPC_TRAIN_RUN_DIR``) plus ``slurm.env``, each logging to ``logs/rank-N.log``;
* ends the others when one rank fails (srun's ``--kill-on-bad-exit``), naming it in ``logs/batch.log``;
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..rank.heartbeat import HANG_TIMEOUT_ENV
from ..rank.preempt import signal_number  # USR2, SIGUSR2 or 12, as the ranks read slurm.signal
from ..runs import liveness, rundir
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
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    _signal_all(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _exit_code(returncode: int) -> int:
    """A process's exit status as a shell reports it (killed by signal N: 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


class Hung(Exception):
    """The watchdog ended the launch; ``reason`` names the rank that stopped first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _supervise(procs: list[subprocess.Popen], launch: Launch, batch_log: Any, instance: str = "") -> int:
    """Wait for the ranks; the launch's exit code (the first failing rank's, as srun reports it). Raises
    :class:`Hung` when the watchdog ended them."""
    run_dir = Path(launch.run_dir)
    started, last_check, signalled = time.monotonic(), 0.0, False
    host = socket.gethostname()
    watch = liveness.Watch(launch.world_size, launch.hang_timeout_s, instance)
    # Poll every rank each time (a generator in any() stops at the first live one, and a failure of a later
    # rank would go unseen until the earlier ones ended).
    while any([p.poll() is None for p in procs]):
        now = time.monotonic()
        failed = [(rank, _exit_code(p.returncode)) for rank, p in enumerate(procs)
                  if p.returncode not in (None, 0, rundir.EXIT_CHECKPOINTED)]
        if failed:
            rank, code = failed[0]
            _log(batch_log, f"error: {host}: task {rank}: Exited with exit code {code}")
            _end_all(procs, wait_s=5.0)  # like srun --kill-on-bad-exit
            return code
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
    codes = [_exit_code(p.returncode) for p in procs]
    for rank, code in enumerate(codes):
        if code not in (0, rundir.EXIT_CHECKPOINTED):
            _log(batch_log, f"error: {host}: task {rank}: Exited with exit code {code}")
            return code
    return max(codes)


def _instance(launch: Launch, launches: int) -> tuple[str, int]:
    """The launch's instance id and restart count: a Slurm job's when packed in one (so the ranks' lines and
    Slurm's view agree), else the local run's own count of launches."""
    if os.environ.get("SLURM_JOB_ID"):
        return rundir.instance_of()
    return f"local:{launch.run_id}.{launches}", launches


def run_launch(launch: Launch, python: str, cwd: str) -> int:
    """One launch of one run: the ranks, their logs, and the state lines around them."""
    run_dir = Path(launch.run_dir)
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    with open(run_dir / rundir.BATCH_LOG, "a", encoding="utf-8") as batch_log:
        events = rundir.read_events(run_dir)
        if rundir.fold(events).state == rundir.CANCELLED:
            _log(batch_log, "cancelled before it started")
            return 128 + signal.SIGTERM
        launches = sum(1 for e in events if e.get("event") == rundir.RUNNING and e.get("writer") == "launcher")
        instance, restart = _instance(launch, launches)
        rundir.append_event(run_dir, rundir.RUNNING, writer="launcher", instance=instance, restart=restart,
                            job_id=launch.run_id, pid=os.getpid())
        port = _free_port()
        _log(batch_log, f"local launch {launches} of {launch.run_id}: {launch.world_size} rank(s), "
                        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}")
        command = [python, "-u", "-m", launch.entry, "--resolved", str(run_dir / rundir.JOB_YAML)]
        procs = []
        for rank in range(launch.world_size):
            with open(run_dir / rundir.RANK_LOG.format(rank=rank), "ab") as rank_log:
                # A process group per rank: the watchdog kills a hung rank with its data workers.
                procs.append(subprocess.Popen(command, env=rank_environment(launch, rank, port, instance), cwd=cwd,
                                              stdin=subprocess.DEVNULL, stdout=rank_log, stderr=subprocess.STDOUT,
                                              process_group=0))
        with _live_lock:
            _live.update(procs)
        hung = None
        try:
            code = _supervise(procs, launch, batch_log, instance)
        except Hung as exc:
            hung, code = exc.reason, rundir.EXIT_HUNG
        finally:
            with _live_lock:
                _live.difference_update(procs)
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
