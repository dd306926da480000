"""The batch script's watchdog, ``python -m hpc_train.slurm.watchdog`` (templates/partials/watchdog_*.j2), and
how Slurm is told about the run's bad-node list (:mod:`hpc_train.runs.bad_nodes`). Torch-free and submitit-free: it
runs in the batch shell, beside the training step.

``watch RUN_DIR SRUN_PID``: while the step runs, read the ranks' heartbeats (:mod:`hpc_train.runs.liveness`).
When no rank has advanced for ``slurm.hang_timeout_s``: a diagnostic step (``srun --overlap``, one task per
node: ``probe``) reads each rank's process state on its node, has every rank that can still run dump its
Python stacks into its log (the faulthandler signal; py-spy too when installed) and reports back; the watchdog
names the rank(s) that stopped first and their host in the batch log, copies the stacks there, kills the
training step (``scancel --signal=KILL`` of its steps) and either records the run ``failed`` (exit
:data:`~hpc_train.runs.rundir.EXIT_HUNG`) or, with ``slurm.hang_action: requeue`` and requeues left, adds the
hung rank's node to the run's excluded nodes and requeues the job
(:data:`~hpc_train.runs.rundir.EXIT_HANG_REQUEUED`; the batch script then exits 0).

Excluding a node: ``scontrol update ExcNodeList`` works only on a pending job, so a running one does
``scontrol requeuehold`` (Slurm ends this attempt: SIGTERM to every process of the batch step, SIGKILL ``KillWait``
seconds later), then the update, then ``scontrol release``: :mod:`hpc_train.slurm.requeue`, whose calls survive
that SIGTERM, are checked against ``scontrol show job`` and retried, and which releases the job even when the
exclusion failed (the batch log and ``status`` then say why).

``start-check RUN_DIR``: a requeued attempt (``SLURM_RESTART_COUNT`` > 0) first adds the node that ended the
previous attempt when nothing could record it (Slurm said NODE_FAIL: the node the batch log names, else that
attempt's batch host), and when it landed on a listed node, updates the exclusion and requeues itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .. import launch_env
from ..hostlist import expand
from ..runs import bad_nodes, liveness, rundir, safe_files
from . import requeue

PROBE_TIMEOUT_S = 60.0
_acting = False


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} hpc-train: watchdog: {text}", flush=True)


def _run(argv: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(list(argv), 1, "", str(exc))


# --------------------------------------------------------------------------------------------------
# The bad-node list: the partition's nodes, and Slurm's ExcNodeList
# --------------------------------------------------------------------------------------------------

def _partition_nodes(partition: str) -> list[str]:
    out = _run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"])
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()}) if out.returncode == 0 else []


def add_excluded(run_dir: Path, node: str, reason: str, environ: dict[str, str] | None = None) -> bool:
    """Add ``node`` to the run's list, unless that would leave the job's partition fewer nodes than the job needs (it
    would pend forever): then it says so and adds nothing."""
    env = os.environ if environ is None else environ
    if node in bad_nodes.excluded_names(run_dir):
        return True
    partition = env.get("SLURM_JOB_PARTITION") or ""
    listed, message = bad_nodes.add(run_dir, node, reason, job_id=env.get("SLURM_JOB_ID"),
                                    restart=launch_env.restart_count(env, "SLURM_RESTART_COUNT"),
                                    pool=_partition_nodes(partition) if partition else [],
                                    pool_name=f"partition {partition}",
                                    needed_nodes=int(env.get("SLURM_JOB_NUM_NODES") or 1))
    if message:
        _say(message)
    return listed


def requeue_excluding(run_dir: Path, job_id: str) -> requeue.RequeueOutcome:
    """Requeue the job with the run's bad-node list added to its ``ExcNodeList`` (:mod:`hpc_train.slurm.requeue`:
    the calls survive the SIGTERM the requeue brings, are checked and retried, and the job is always released)."""
    return requeue.requeue_excluding(job_id, bad_nodes.excluded_names(run_dir))


# --------------------------------------------------------------------------------------------------
# probe: one task per node, reading and dumping the ranks of its node
# --------------------------------------------------------------------------------------------------

def _probe_file(run_dir: Path, instance: str, host: str) -> Path:
    return run_dir / rundir.RANKS_DIR / f"probe-{instance.replace(':', '-')}-{host}.json"


def _plan_file(run_dir: Path, instance: str) -> Path:
    return run_dir / rundir.RANKS_DIR / f"probe-{instance.replace(':', '-')}-plan.json"


def write_plan(run_dir: Path, instance: str, beats: dict[int, liveness.Beat]) -> None:
    """Which ranks (and pids) each node's probe task looks at: from the beats the watchdog has just read, in one
    file, so that each of the N tasks reads one file and not all N heartbeats (N x N reads of a shared
    filesystem at once: 65,536 at 256 nodes)."""
    plan: dict[str, dict[str, int]] = {}
    for rank, beat in beats.items():
        plan.setdefault(beat.host, {})[str(rank)] = beat.pid
    rundir.write_json_atomic(_plan_file(run_dir, instance), plan)


def probe(run_dir: Path, instance: str) -> int:
    """``probe RUN_DIR INSTANCE`` (a task of the diagnostic step): what each rank of this node showed, in a file
    of the run directory (not on stdout: srun splits long lines of several tasks into each other). The ranks of
    this node are the watchdog's plan (:func:`write_plan`); without a plan the task says so and exits 1."""
    host = socket.gethostname()
    try:
        plan = safe_files.read_json(_plan_file(run_dir, instance))  # a run-directory file: no symlink, no FIFO
        pids = {int(rank): int(pid) for rank, pid in plan.get(host, {}).items()}
    except (OSError, ValueError, AttributeError, TypeError, safe_files.RunFileError) as exc:
        print(f"hpc-train: probe on {host}: no readable plan {_plan_file(run_dir, instance)}: {exc}", file=sys.stderr)
        return 1
    logs = rank_logs(run_dir)
    probes = liveness.probe_ranks(pids, lambda r: logs(r), host=host)
    rundir.write_json_atomic(_probe_file(run_dir, instance, host), [
        {"rank": p.rank, "host": p.host, "pid": p.pid, "state": p.state, "stacks": p.stacks, "py_spy": p.py_spy}
        for p in probes])
    return 0


def rank_logs(run_dir: Path):
    """Where rank R's stderr goes: the run record's ``rank_err`` (submitit's form), else its own logs."""
    try:
        logs = json.loads((run_dir / rundir.RUN_JSON).read_text()).get("logs", {})
    except (OSError, ValueError):
        logs = {}
    pattern = logs.get("rank_err") or logs.get("rank_out") or str(run_dir / rundir.RANK_LOG)
    return lambda rank: Path(pattern.format(rank=rank))


def _probe_all(run_dir: Path, instance: str, beats: dict[int, liveness.Beat]) -> list[liveness.Probe]:
    env = os.environ
    write_plan(run_dir, instance, beats)
    argv = ["srun", "--overlap", f"--jobid={env.get('SLURM_JOB_ID', '')}", f"--nodes={env.get('SLURM_JOB_NUM_NODES', 1)}",
            "--ntasks-per-node=1", "--cpus-per-task=1", "--kill-on-bad-exit=0", "--wait=0", sys.executable, "-u",
            "-m", "hpc_train.slurm.watchdog", "probe", str(run_dir), instance]
    out = _run(argv, PROBE_TIMEOUT_S)
    found: dict[int, liveness.Probe] = {}
    for host in {b.host for b in beats.values()}:
        try:
            answers = json.loads(_probe_file(run_dir, instance, host).read_text())
        except (OSError, ValueError):
            continue
        for d in answers:
            found[int(d["rank"])] = liveness.Probe(int(d["rank"]), d["host"], int(d["pid"]), d["state"],
                                                         d.get("stacks") or "", d.get("py_spy"))
    if out.returncode != 0 or not found:
        _say(f"the diagnostic step exited {out.returncode}: {(out.stderr or '').strip()[-300:]}")
    for rank, beat in beats.items():  # a node that did not answer: its ranks are named so
        found.setdefault(rank, liveness.Probe(rank, beat.host, beat.pid, "unreachable"))
    return [found[r] for r in sorted(found)]


# --------------------------------------------------------------------------------------------------
# watch: the loop beside the training step
# --------------------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _on_term(_signum: int, _frame: object) -> None:
    if not _acting:  # the step ended and the batch script stops the watch: nothing to do
        os._exit(0)


def _kill_step(job_id: str, srun_pid: int) -> None:
    """SIGKILL to the job's steps (never the batch shell), then wait for srun to return."""
    steps = _run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"]).stdout.split()
    for step in steps:
        if step.rsplit(".", 1)[-1].isdigit():
            _run(["scancel", "--signal=KILL", step])
    deadline = time.monotonic() + 60
    while _alive(srun_pid) and time.monotonic() < deadline:
        time.sleep(0.5)


def _watch_loop(run_dir: Path, srun_pid: int, spec: Any, instance: str) -> liveness.Watch | None:
    s = spec.slurm
    watch = liveness.Watch(s.world_size, s.hang_timeout_s, instance)
    poll_s = min(5.0, max(0.5, s.hang_timeout_s / 20))
    while _alive(srun_pid):
        watch.update(liveness.read_beats(run_dir, instance))
        if watch.hung():
            return watch
        time.sleep(poll_s)
    return None


def watch(run_dir: Path, srun_pid: int) -> int:
    """``watch RUN_DIR SRUN_PID`` (module docstring); 0 when the step ended by itself."""
    global _acting
    from ..config import read_text_file, spec_from_yaml_text

    signal.signal(signal.SIGTERM, _on_term)
    spec = spec_from_yaml_text(read_text_file(run_dir / rundir.JOB_YAML), str(run_dir / rundir.JOB_YAML))
    instance, restart = rundir.instance_of()
    found = _watch_loop(run_dir, srun_pid, spec, instance)
    if found is None:
        return 0
    _acting = True
    now = time.monotonic()
    probes = _probe_all(run_dir, instance, found.beats)
    ranks = liveness.suspects(probes, found)
    reason = liveness.hang_reason(ranks, found, probes, now, {p.rank: p.host for p in probes})
    _say(reason)
    for line in liveness.stack_lines(probes):
        _say(line)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    _kill_step(job_id, srun_pid)
    _say("ended the training step")
    return _decide(run_dir, spec, instance, restart, reason, {found.beats[r].host for r in ranks if r in found.beats})


def _decide(run_dir: Path, spec: Any, instance: str, restart: int, reason: str, hosts: set[str]) -> int:
    s = spec.slurm
    from ..rank.preempt import requeue_job_id

    job_id = requeue_job_id() or ""
    if s.hang_action == "requeue" and restart < s.max_requeues and job_id:
        if s.exclude_bad_nodes and len(hosts) == 1:
            add_excluded(run_dir, next(iter(hosts)), reason)
        rundir.append_event(run_dir, rundir.REQUEUED, writer="watchdog", instance=instance, restart=restart,
                            exit_code=rundir.EXIT_HANG_REQUEUED, reason=reason)
        outcome = requeue_excluding(run_dir, job_id)
        _say(outcome.message)
        if outcome.requeued:
            _note_problem(run_dir, instance, restart, reason, outcome)
            return rundir.EXIT_HANG_REQUEUED
        reason += f" ({outcome.message})"
    elif s.hang_action == "requeue":
        reason += f" (not requeued: restart {restart} of at most {s.max_requeues})"
    rundir.append_event(run_dir, rundir.FAILED, writer="watchdog", instance=instance, restart=restart,
                        exit_code=rundir.EXIT_HUNG, reason=reason)
    return rundir.EXIT_HUNG


def _note_problem(run_dir: Path, instance: str, restart: int, reason: str, outcome: requeue.RequeueOutcome) -> None:
    """A requeue that could not exclude the node (or release the job) says why in the run's state too: ``status``
    shows the note beside Slurm's reason while the job waits to run again."""
    if outcome.problem:
        rundir.append_event(run_dir, rundir.REQUEUED, writer="watchdog", instance=instance, restart=restart,
                            exit_code=rundir.EXIT_HANG_REQUEUED, reason=reason, note=outcome.problem)


# --------------------------------------------------------------------------------------------------
# start-check: a requeued attempt and the node that ended the previous one
# --------------------------------------------------------------------------------------------------

def _previous_attempt(run_dir: Path, restart: int) -> tuple[list[dict[str, Any]], str]:
    """The state lines of the previous attempt of this job, and its instance id."""
    job = os.environ.get("SLURM_JOB_ID", "")
    instance = f"slurm:{job}.{restart - 1}"
    return [e for e in rundir.read_events(run_dir) if e.get("instance") == instance], instance


def _node_failure(run_dir: Path, restart: int) -> tuple[str, str] | None:
    """(node, reason) when the previous attempt ended without a word from its batch shell and Slurm says a node
    failed: the node its batch log names, else its batch host."""
    events, _ = _previous_attempt(run_dir, restart)
    if not events or any(e.get("event") in (rundir.EXIT, rundir.REQUEUED) for e in events):
        return None
    job = os.environ.get("SLURM_JOB_ID", "")
    acct = _run(["sacct", "-n", "-P", "-X", "-D", "-j", job, "-o", "JobID,State,NodeList"]).stdout.splitlines()
    ended = [line.split("|") for line in acct if line.count("|") == 2 and not line.split("|")[1].startswith("RUNNING")]
    if not ended or not ended[-1][1].startswith("NODE_FAIL"):
        return None
    named = _named_in_batch_log(run_dir)
    started = next((e for e in events if e.get("event") == rundir.RUNNING and e.get("writer") == "launcher"), {})
    node = named or started.get("host") or (expand(ended[-1][2]) or [""])[0]
    return (node, f"NODE_FAIL of attempt {restart - 1}") if node else None


def _named_in_batch_log(run_dir: Path) -> str | None:
    try:
        text = (run_dir / rundir.BATCH_LOG).read_text(errors="replace")[-200_000:]
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        if "Node failure on " in line:
            return line.rsplit("Node failure on ", 1)[1].split()[0].strip(":,")
    return None


def start_check(run_dir: Path) -> int:
    """``start-check RUN_DIR`` (module docstring): 0 to go on, EXIT_HANG_REQUEUED when it requeued itself."""
    restart = launch_env.restart_count(os.environ, "SLURM_RESTART_COUNT")
    if restart > 0:
        failed = _node_failure(run_dir, restart)
        if failed:
            add_excluded(run_dir, *failed)
    listed = set(bad_nodes.excluded_names(run_dir))
    here = [n for n in expand(os.environ.get("SLURM_JOB_NODELIST", "")) if n in listed]
    if not here:
        return 0
    from ..rank.preempt import requeue_job_id

    instance, restart = rundir.instance_of()
    reason = f"landed on excluded node(s) {','.join(here)}"
    rundir.append_event(run_dir, rundir.REQUEUED, writer="watchdog", instance=instance, restart=restart, reason=reason)
    outcome = requeue_excluding(run_dir, requeue_job_id() or "")
    _say(f"{reason}: {outcome.message}")
    if outcome.requeued:
        _note_problem(run_dir, instance, restart, reason, outcome)
    return rundir.EXIT_HANG_REQUEUED if outcome.requeued else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "watch":
        return watch(Path(args[1]), int(args[2]))
    if len(args) == 3 and args[0] == "probe":
        return probe(Path(args[1]), args[2])
    if len(args) == 2 and args[0] == "start-check":
        return start_check(Path(args[1]))
    print("usage: python -m hpc_train.slurm.watchdog watch RUN_DIR SRUN_PID | probe RUN_DIR INSTANCE | "
          "start-check RUN_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
