"""Local runs (``--cluster local``, or ``auto`` without ``sbatch``): the sbatch script's counterpart on
one machine, so the embedded default does what Slurm does.

``submit`` writes every run directory and a plan, then starts one detached launcher,
``python -m hpc_train.local PLAN``, which runs the plan's launches one after another (a sweep point
each, or the same run again for ``--chain``; ``--resume`` is a launch of an existing run). A launch:

* records ``running`` in the run's state log, starts the ranks with the rank environment (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``,
  ``HPC_TRAIN_RUN_DIR``) plus ``slurm.env``, each logging to ``logs/rank-N.log``;
* ends the others when one rank fails (srun's ``--kill-on-bad-exit``), naming it in ``logs/batch.log``;
* sends ``slurm.signal`` ``signal_delay_s`` before ``slurm.time`` and ends the ranks at it;
* ends the ranks when the run is cancelled (``hpc-train cancel`` records it; the launcher sees it);
* records the launch's exit code, as the batch script's exit block does.

What only a cluster has (modules, venv, containers, partitions, requeue) is ignored, and said so.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from . import rundir

POLL_S = 0.2
KILL_WAIT_S = 5.0
"""After SIGTERM, how long ranks get before SIGKILL (Slurm's KillWait)."""
LAUNCHER_MODULE = "hpc_train.local"


@dataclass(frozen=True)
class Launch:
    """One launch of the plan: which run, how many ranks, and the limits Slurm would enforce."""

    run_dir: str
    run_id: str
    world_size: int
    visible_gpus: int
    time_limit_s: int
    signal: str
    signal_delay_s: int
    env: dict[str, str]


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
        "HPC_TRAIN_LAUNCHER": "local", "PYTHONUNBUFFERED": "1",
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


def _supervise(procs: list[subprocess.Popen], launch: Launch, batch_log: Any) -> int:
    """Wait for the ranks; the launch's exit code (the first failing rank's, as srun reports it)."""
    run_dir = Path(launch.run_dir)
    started, last_check, signalled = time.monotonic(), 0.0, False
    host = socket.gethostname()
    while any(p.poll() is None for p in procs):
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
        if not signalled and now - started >= launch.time_limit_s - launch.signal_delay_s:
            signalled = True
            _log(batch_log, f"{launch.signal_delay_s} s before the time limit: sending SIG{launch.signal} to the ranks")
            _signal_all(procs, int(launch.signal) if launch.signal.isdigit() else signal.Signals[f"SIG{launch.signal}"])
        if now - started >= launch.time_limit_s:
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


def run_launch(launch: Launch, python: str, cwd: str) -> int:
    """One launch of one run: the ranks, their logs, and the state lines around them."""
    run_dir = Path(launch.run_dir)
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    with open(run_dir / rundir.BATCH_LOG, "a", encoding="utf-8") as batch_log:
        if rundir.read_state(run_dir).state == rundir.CANCELLED:
            _log(batch_log, "cancelled before it started")
            return 128 + signal.SIGTERM
        launches = sum(1 for e in rundir.read_events(run_dir) if e.get("event") == rundir.RUNNING
                       and e.get("writer") == "launcher")
        instance = f"local:{launch.run_id}.{launches}"
        rundir.append_event(run_dir, rundir.RUNNING, writer="launcher", instance=instance, restart=launches,
                            job_id=launch.run_id, pid=os.getpid())
        port = _free_port()
        _log(batch_log, f"local launch {launches} of {launch.run_id}: {launch.world_size} rank(s), "
                        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}")
        command = [python, "-u", "-m", "hpc_train.train", "--resolved", str(run_dir / rundir.JOB_YAML)]
        procs = []
        for rank in range(launch.world_size):
            with open(run_dir / rundir.RANK_LOG.format(rank=rank), "ab") as rank_log:
                procs.append(subprocess.Popen(command, env=rank_environment(launch, rank, port, instance), cwd=cwd,
                                              stdin=subprocess.DEVNULL, stdout=rank_log, stderr=subprocess.STDOUT))
        code = _supervise(procs, launch, batch_log)
        if code != 0 and rundir.read_state(run_dir).state == rundir.PREEMPTED:
            _log(batch_log, f"checkpointed but not requeued; continue with: hpc-train submit --resume {run_dir}")
            code = rundir.EXIT_CHECKPOINTED
        _log(batch_log, f"ranks exited with status {code}")
        if rundir.read_state(run_dir).state != rundir.CANCELLED:
            rundir.append_event(run_dir, rundir.EXIT, writer="launcher", instance=instance, restart=launches,
                                exit_code=code)
        return code


# --------------------------------------------------------------------------------------------------
# The submit side: run directories, the plan, the detached launcher
# --------------------------------------------------------------------------------------------------

# slurm.* keys that only mean something on a cluster (a local run says which of them a job set).
_IGNORED_LOCALLY = ("modules", "venv", "conda_env", "python", "container", "partition", "account", "qos",
                    "constraint", "exclusive", "mem_gb", "requeue", "max_requeues", "srun_args", "cpu_bind",
                    "extra_sbatch", "gpu_flag", "gres_name", "template", "launcher")


def ignored_keys(spec) -> list[str]:
    """The slurm.* keys set away from their defaults that a local run cannot honour."""
    from .config import SlurmConfig

    default = SlurmConfig()
    return [f"slurm.{key}" for key in _IGNORED_LOCALLY if getattr(spec.slurm, key) != getattr(default, key)]


def local_note(spec) -> str:
    ignored = ignored_keys(spec)
    if not ignored:
        return ""
    applied = ", slurm.env applied" if spec.slurm.env else ""
    return (f"running locally: {', '.join(ignored)} ignored (the ranks run {sys.executable} in this "
            f"environment{applied})")


def _launch_for(spec, run_dir: Path) -> dict[str, Any]:
    s = spec.slurm
    return dataclasses.asdict(Launch(run_dir=str(run_dir), run_id=run_dir.name, world_size=s.ranks_per_node,
                                     visible_gpus=s.gpus_per_node, time_limit_s=s.time_min * 60, signal=s.signal,
                                     signal_delay_s=s.signal_delay_s, env=dict(s.env)))


def plan_text(resolved, run_dirs: Sequence[Path]) -> str:
    """What a local submit would run (``submit --dry-run`` without Slurm), written nowhere."""
    lines = []
    for spec, run_dir in zip(resolved.sweep or [resolved.spec], run_dirs):
        s = spec.slurm
        lines.append(f"# {spec.name}: {s.ranks_per_node} local rank(s) in {run_dir}, time limit {s.time} "
                     f"(SIG{s.signal} {s.signal_delay_s} s before it)")
        for key, value in sorted(s.env.items()):
            lines.append(f"export {key}={shlex.quote(value)}")
        job_yaml = shlex.quote(str(run_dir / rundir.JOB_YAML))
        for rank in range(s.ranks_per_node):
            log = shlex.quote(str(run_dir / rundir.RANK_LOG.format(rank=rank)))
            lines.append(f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE={s.ranks_per_node} MASTER_ADDR=127.0.0.1 "
                         f"{shlex.quote(sys.executable)} -u -m hpc_train.train --resolved {job_yaml} > {log}")
    return "\n".join(lines) + "\n"


def new_run_ids(count: int) -> list[str]:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"local-{stamp}-{os.getpid()}"
    return [base] if count == 1 else [f"{base}_{i}" for i in range(count)]


def submit_local(resolved, *, cwd: Path | None = None, resume_dir: Path | None = None, chain: int = 1,
                 note: str = ""):
    """Write the run directories and start the local launcher; returns at once (like sbatch)."""
    from .config import dump_yaml
    from .submission import SubmitResult, continue_run_record, run_record, write_run_files
    from .undo import Created

    cwd = (cwd or Path.cwd()).resolve()
    specs = list(resolved.sweep or [resolved.spec])
    spec = specs[0]
    group = rundir.run_group(rundir.runs_root(spec.runs_dir, cwd), spec.name)
    created = Created()
    created.mkdir(group)
    try:
        if resume_dir is not None:
            run_dirs = [resume_dir]
            created.write(resume_dir / rundir.JOB_YAML, dump_yaml(spec))  # --set may change the continued run
            continue_run_record(resume_dir, resume_dir.name, _logs(resume_dir))
            rundir.append_event(resume_dir, rundir.QUEUED, writer="submit", job_id=resume_dir.name)
        else:
            run_dirs = [group / run_id for run_id in new_run_ids(len(specs))]
            for task_spec, run_dir in zip(specs, run_dirs):
                record = run_record(task_spec, resolved.sources, run_dir, job_id=run_dir.name, cluster="local",
                                    logs=_logs(run_dir))
                write_run_files(created, run_dir, task_spec, record)
        launches = [_launch_for(s, d) for s, d in zip(specs, run_dirs)]
        launches += [launches[-1]] * (chain - 1)  # a chain: the same run again, resuming
        plan = group / f".local-plan-{run_dirs[0].name}.json"
        created.write(plan, json.dumps({"launches": launches, "python": sys.executable, "cwd": str(cwd)}))
        with open(run_dirs[0] / rundir.BATCH_LOG, "a", encoding="utf-8") as launcher_log:
            proc = subprocess.Popen([sys.executable, "-m", LAUNCHER_MODULE, str(plan)], cwd=cwd,
                                    stdin=subprocess.DEVNULL, stdout=launcher_log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # not ended by the terminal, like a Slurm job
    except BaseException:
        created.undo()
        raise
    for run_dir in run_dirs:
        _note_launcher(run_dir, proc.pid)
    notes = [n for n in (note, local_note(spec),
                         f"{len(run_dirs)} local runs, one after another" if len(run_dirs) > 1 else "",
                         f"a chain of {chain} local launches of {run_dirs[0].name}" if chain > 1 else "") if n]
    first = run_dirs[0]
    return SubmitResult(job_id=first.name, run_name=f"{spec.name}/{first.name}", run_dir=str(first), cluster="local",
                        note="; ".join(notes), tasks=tuple(d.name for d in run_dirs) if len(run_dirs) > 1 else (),
                        run_dirs=tuple(str(d) for d in run_dirs))


def _logs(run_dir: Path) -> dict[str, str]:
    return {"batch": str(run_dir / rundir.BATCH_LOG), "rank_out": str(run_dir / rundir.RANK_LOG)}


def _note_launcher(run_dir: Path, pid: int) -> None:
    path = run_dir / rundir.RUN_JSON
    record = json.loads(path.read_text(encoding="utf-8"))
    rundir.write_json_atomic(path, {**record, "launcher_pid": pid})


def main(argv: list[str] | None = None) -> int:
    """``python -m hpc_train.local PLAN``: run the plan's launches in order (nothing else reads argv)."""
    args = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal does not end the runs (Slurm's do not)
    code = 0
    for item in plan["launches"]:
        code = run_launch(Launch(**item), plan["python"], plan["cwd"])
    Path(args[0]).unlink(missing_ok=True)
    return code


def is_alive(pid: int) -> bool:
    """The local launcher with this pid still runs (a reused pid running something else does not count;
    the first milliseconds, before the launcher's exec, it is still the submitting hpc-train)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):  # ended, not yet reaped (the submitting hpc-train is its parent)
        return False
    if not cmdline:  # between fork and exec
        return True
    return LAUNCHER_MODULE.encode() in cmdline or b"hpc-train" in cmdline or b"hpc_train.cli" in cmdline


if __name__ == "__main__":
    sys.exit(main())
