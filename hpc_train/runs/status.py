"""What ``status`` and ``logs`` show of a run, folded from what its run directory recorded.

A run's state is what its run directory says (:func:`hpc_train.runs.rundir.read_state`), reconciled with a
scheduler's view of its job (:class:`~hpc_train.runs.scheduler_job.SchedulerJob`, which the front asks the
backend for: :mod:`hpc_train.front.status`) for what no exit block sees: the time limit, an out-of-memory kill,
a node failure or a cancel; for a local run, whether its runner still lives. Nothing here asks a scheduler.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from . import bad_nodes, liveness, rundir, safe_files
from .index import Run
from .scheduler_job import SchedulerJob

# What the scheduler's own ending of a job means for the run, when the run had not recorded its end.
_ENDED_BY_STATE = {"time_limit": rundir.FAILED, "failure": rundir.FAILED, "cancel": rundir.CANCELLED,
                   "preemption": rundir.PREEMPTED}


def reconcile(run: rundir.RunState, job: SchedulerJob | None) -> tuple[str, str]:
    """(state, reason) of a scheduled run from its run directory and the scheduler's view of its job."""
    if job is None or job.phase == "unknown":
        if run.state is None:
            return "unknown", job.reason if job else "nothing recorded"
        if job is not None and not job.answered and not run.final:  # cannot be told here
            return "unknown", f"{job.reason} (last recorded: {run.state})"
        return run.state, run.reason
    if job.active:
        if run.state == rundir.CANCELLED:
            return rundir.CANCELLED, run.reason
        if job.phase == "running":
            return rundir.RUNNING, ""
        again = run.state in (rundir.REQUEUED, rundir.PREEMPTED, rundir.RUNNING) or job.phase == "requeued"
        note = run.note if run.state == rundir.REQUEUED else ""  # the watchdog could not exclude the node: why
        return (rundir.REQUEUED if again else rundir.QUEUED), "; ".join(filter(None, (job.reason, note)))
    said = f"{job.scheduler}: {job.said}"
    if job.ended_by is not None:
        state, why = _ENDED_BY_STATE[job.ended_by], job.cause
        if run.state == rundir.PREEMPTED and job.ended_by != "failure":  # it had checkpointed before it was ended
            state, why = (rundir.CANCELLED if job.ended_by == "cancel" else rundir.PREEMPTED), "checkpointed"
        if run.state == rundir.CANCELLED:
            return rundir.CANCELLED, run.reason or why
        return state, f"{why} ({said})"
    if run.final:
        return run.state or "unknown", run.reason
    return (rundir.COMPLETED, "") if job.succeeded else (rundir.FAILED, said)


def _local_state(run: Run, state: rundir.RunState) -> tuple[str, str]:
    """A local run's state: its run directory's, unless its launcher died before recording the end."""
    if state.final:
        return state.state or "unknown", state.reason
    pid = int(run.record.get("launcher_pid") or 0)
    if pid and not liveness.is_alive(pid):
        left = liveness.orphans(run.run_dir)
        if left:  # not ended: cancel ends them, and --resume waits for that
            return rundir.RUNNING, (f"its local launcher (pid {pid}) ended, but processes of its ranks still run "
                                    f"(pids {', '.join(map(str, left))}); hpc-train cancel {run.name} ends them")
        who = "its process" if run.record.get("alone") else "its local launcher"
        return rundir.FAILED, f"{who} (pid {pid}) ended without recording how the run ended"
    return state.state or "unknown", state.reason


_TASK_ERROR = re.compile(r"(?:srun|hpc-train): error: (?P<host>\S+): tasks? (?P<tasks>[\d,-]+): (?P<what>.+)")
"""srun's line for a failed task, which the local launcher writes too (``hpc-train: error: ...``)."""


def first_failure_in(text: str) -> str | None:
    """The first rank that failed and its host, from a batch log: srun's (or the local launcher's)
    ``error: gpu02: task 3: Exited with exit code 1`` (ranks killed afterwards are not the cause)."""
    for line in text.splitlines():
        m = _TASK_ERROR.search(line)
        if m and "Killed" not in m.group("what") and "terminated" not in m.group("what").lower():
            return f"rank {m.group('tasks')} on {m.group('host')}: {m.group('what').strip()}"
    return None


def log_root(run: Run) -> Path:
    """Where a run's recorded log paths may point: its job's directory of runs (its own logs/, and submitit's
    ``.submitit`` beside the runs), nowhere else."""
    return run.run_dir.parent


def _log_path(run: Run, recorded: str, key: str) -> Path:
    return safe_files.confined(recorded, log_root(run), f"{rundir.RUN_JSON} logs.{key}")


def _tail_text(path: Path, limit_bytes: int = 16 << 20) -> str:
    """The last ``limit_bytes`` of a regular file (a batch log: srun's error lines are near its end)."""
    size = os.lstat(path).st_size
    data, _ = safe_files.read_chunk(path, max(0, size - limit_bytes), limit_bytes)
    return data.decode("utf-8", errors="replace")


def first_failure(run: Run) -> str | None:
    """The first rank that failed and its host, from the batch log."""
    batch = run.record.get("logs", {}).get("batch")
    candidates = [_log_path(run, batch, "batch")] if batch and not outside_batch_log(run) else []
    if batch and batch.endswith(".err"):
        candidates.append(_log_path(run, batch[:-4] + ".out", "batch"))
    for path in candidates:
        try:
            found = first_failure_in(_tail_text(path))
        except OSError:
            continue
        if found:
            return found
    return None


def progress(run_dir: Path) -> dict[str, Any]:
    """The last evaluation's figures from metrics.jsonl."""
    last = None
    try:
        lines = safe_files.read_text(run_dir / rundir.METRICS, safe_files.LOG_MAX_BYTES, "replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "record" not in record:  # an evaluation (not the ranks' compute times)
            last = record
    if not isinstance(last, dict):
        return {}
    keep = ("epoch", "global_step", "top1", "balanced", "many", "medium", "few")
    for key in keep:
        value = last.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise safe_files.RunFileError(f"{rundir.METRICS}: {key} is {type(value).__name__}, not a number")
    return {k: round(last[k], 4) if isinstance(last[k], float) else last[k] for k in keep if k in last}


def run_state(run: Run, job: SchedulerJob | None, recorded: rundir.RunState | None = None) -> tuple[str, str]:
    """(state, reason) of a run: what its run directory recorded, reconciled with the scheduler's view of its job
    (``job``; None for a local run) or with its local runner. Reads no log and no metrics (polling loops)."""
    if run.unreadable:
        return "unknown", run.unreadable
    try:
        recorded = recorded or rundir.read_state(run.run_dir)
    except safe_files.RunFileError as exc:
        return "unknown", str(exc)
    if run.cluster == "local":
        return _local_state(run, recorded)
    return reconcile(recorded, job)


STATUS_FIELDS = ("run", "job_id", "cluster", "run_dir", "slurm_state", "source", "elapsed", "nodes",
                 "slurm_exit_code", "slurm_reason", "state", "reason", "exit_code", "restarts", "first_failure",
                 "progress", "last_progress_s", "slowest_rank", "straggler", "excluded_nodes", "hint")
"""Every field of ``status --json`` for one run, in its order (those without a value are left out; the README
lists them, and a test ties the two)."""


def run_status(run: Run, job: SchedulerJob | None) -> dict[str, Any]:
    """A run's status: ``state`` (queued, running, completed, failed, cancelled, preempted, requeued) and
    why, with the scheduler's own view (``slurm_state``, from ``job``: None for a local run) and the training
    progress."""
    out: dict[str, Any] = {"run": run.name, "job_id": run.job_id, "cluster": run.cluster, "run_dir": str(run.run_dir)}
    if isinstance(run.record.get("workdir"), str):  # a command job's working directory (run.json)
        out["workdir"] = run.record["workdir"]
    try:
        return _folded_status(run, job, out)
    except safe_files.RunFileError as exc:  # this run is unknown, with the reason; the others are listed as usual
        return {**out, "state": "unknown", "reason": str(exc)}


def _folded_status(run: Run, job: SchedulerJob | None, out: dict[str, Any]) -> dict[str, Any]:
    recorded = rundir.read_state(run.run_dir)
    if run.on_slurm and job is not None:
        out.update(slurm_state=job.state, source=job.source, elapsed=job.elapsed, nodes=job.nodes,
                   slurm_exit_code=job.exit_code, slurm_reason=job.reason if job.phase == "unknown" else "")
    state, reason = run_state(run, job, recorded)
    out.update(state=state, reason=reason, exit_code=recorded.exit_code, restarts=recorded.restart or None)
    if state == rundir.FAILED and not reason.startswith("rank "):
        failure = first_failure(run)
        if failure:
            out["first_failure"] = failure
    figures = progress(run.run_dir)
    if figures:
        out["progress"] = figures
    out.update(health(run, state, reason))
    if state == rundir.PREEMPTED or (state == rundir.CANCELLED and "checkpointed" in reason):
        out["hint"] = f"continue it with: hpc-train submit --resume {run.name}"
    return {k: v for k, v in out.items() if v not in ("", None)}


def _hang_timeout_s(run: Run) -> float:
    try:
        return float(safe_files.read_json(run.run_dir / rundir.CONFIG_JSON)["slurm"]["hang_timeout_s"])
    except (OSError, ValueError, KeyError, TypeError, safe_files.RunFileError):
        return 0.0


def compute_records(run_dir: Path) -> list[dict[str, Any]]:
    """The ranks' compute-time records of metrics.jsonl, one per epoch (hpc_train/train/observe/stragglers.py)."""
    try:
        lines = safe_files.read_text(run_dir / rundir.METRICS, safe_files.LOG_MAX_BYTES, "replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        if '"rank_compute"' in line:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("stragglers") or [], list) and all(
                    _is_straggler(s) for s in record.get("stragglers") or []):
                found.append(record)
            else:
                raise safe_files.RunFileError(f"{rundir.METRICS}: a rank_compute line with wrong types")
    return found


_STRAGGLER = {"rank": (int,), "host": (str,), "ratio": safe_files.NUMBER}


def _is_straggler(item: Any) -> bool:
    return (isinstance(item, dict) and all(item.get(key) is not None for key in _STRAGGLER)
            and not safe_files.wrong_type(item, _STRAGGLER))


def last_straggler(run_dir: Path) -> dict[str, Any] | None:
    """The slowest straggler of the last epoch whose compute times were recorded (``status``)."""
    records = compute_records(run_dir)
    slow = records[-1].get("stragglers") if records else None
    return None if not slow else {**max(slow, key=lambda s: s["ratio"]), "epoch": records[-1].get("epoch")}


def stragglers_of_run(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank that was a straggler in some epoch (``report``): in how many of the recorded epochs, and its
    largest ratio to the median."""
    records = compute_records(run_dir)
    by_rank: dict[int, dict[str, Any]] = {}
    for record in records:
        for s in record.get("stragglers") or []:
            seen = by_rank.setdefault(s["rank"], {"rank": s["rank"], "host": s["host"], "epochs": 0, "max_ratio": 0.0})
            seen["epochs"] += 1
            seen["max_ratio"] = max(seen["max_ratio"], s["ratio"])
    return [{**v, "of_epochs": len(records)} for _, v in sorted(by_rank.items())]


def health(run: Run, state: str, reason: str) -> dict[str, Any]:
    """What the heartbeats, the ranks' compute times and the bad-node list say (issue 18): a running run whose
    slowest rank made no progress for a third of ``slurm.hang_timeout_s`` (at most 5 minutes) is ``stalled``."""
    out: dict[str, Any] = {}
    if state == rundir.RUNNING:
        found = liveness.stall(run.run_dir)
        if found is not None:
            slow = found.slowest
            out["last_progress_s"] = round(found.last_progress_s, 1)
            out["slowest_rank"] = {"rank": slow.rank, "host": slow.host, "last_progress_s": round(found.slowest_s, 1)}
            if found.slowest_s >= liveness.stall_threshold_s(_hang_timeout_s(run)):
                out["reason"] = "; ".join(r for r in (f"stalled (no progress for {found.slowest_s:.0f} s, rank "
                                                      f"{slow.rank} on {slow.host})", reason) if r)
    straggler = last_straggler(run.run_dir)
    if straggler and state not in rundir.FINAL_STATES | {rundir.QUEUED}:
        out["straggler"] = straggler
    out["excluded_nodes"] = bad_nodes.excluded_names(run.run_dir) or None
    return out


def _rank_path(template: str, rank: int) -> str:
    """A recorded rank log path with its ``{rank}`` filled in (nothing else: a ``{0.__class__}`` in a shared
    run.json is text, never a format field)."""
    return template.replace("{rank}", str(rank))


def log_files(run: Run, rank: int | None = None) -> list[tuple[str, Path]]:
    """(label, path) of a run's logs: the batch log, then each rank's (or only ``rank``'s). Under
    ``--launcher torchrun`` a log is a node's (its one Slurm task runs torchrun, whose workers share it):
    rank R is in node ``R // ranks_per_node``'s, labelled with the ranks it holds."""
    logs = run.record.get("logs", {})
    files: list[tuple[str, Path]] = []
    if rank is None and logs.get("batch") and not outside_batch_log(run):
        files.append(("batch", _log_path(run, logs["batch"], "batch")))
    world = int(run.record.get("world_size") or 0)
    per_node = int(run.record.get("ranks_per_node") or 0)
    # The local launcher starts every rank itself (one log each), whatever launcher the job names for Slurm.
    by_node = run.record.get("launcher") == "torchrun" and per_node > 0 and run.record.get("cluster") != "local"
    if by_node:  # the task index of a log file is the node's
        tasks = [rank // per_node] if rank is not None else list(range(max(1, world // per_node)))
    else:
        tasks = [rank] if rank is not None else list(range(world))
    if rank is None and not world:  # a plain sbatch run: take the rank logs that exist
        pattern = _log_path(run, logs.get("rank_out", str(run.run_dir / rundir.RANK_LOG)), "rank_out")
        tasks = sorted(int(m.group(1)) for p in pattern.parent.glob("*")
                       if (m := re.fullmatch(re.escape(pattern.name).replace(r"\{rank\}", r"(\d+)"), p.name)))
    for task in tasks:
        label = (f"node {task}, ranks {task * per_node}-{task * per_node + per_node - 1}" if by_node
                 else f"rank {task}")
        for key in ("rank_err", "rank_out"):  # progress (stderr) before the final table (stdout)
            if logs.get(key):
                path = _log_path(run, _rank_path(logs[key], task), key)
                if rank is None and task == 0 and logs.get("batch") and path == Path(logs["batch"]):
                    continue  # submitit's form: task 0 shares the batch log
                files.append((label, path))
    return files


def _new_chunks(path: Path, offsets: dict[Path, int]) -> Iterator[bytes]:
    """What a log gained since ``offsets[path]``, a bounded chunk at a time (a log is never read whole, and one
    that is not a regular file is refused: :mod:`.safe_files`)."""
    while True:
        data, after = safe_files.read_chunk(path, offsets[path])
        if not data:
            return
        if len(data) == safe_files.CHUNK_BYTES and b"\n" in data:  # more follows: end this chunk at a whole line
            data = data[:data.rindex(b"\n") + 1]
            after = offsets[path] + len(data)
        offsets[path] = after
        yield data


def outside_batch_log(run: Run) -> str:
    """Where a plain ``sbatch`` run's batch log really is, when its script linked ``logs/batch.log`` to an
    ``#SBATCH --output`` outside the job's directory (templates/partials/run_dir.j2); "" otherwise. hpc-train does not
    read it (it reads only files under the job's directory) but says where it is. Any other recorded path that leaves
    the directory stays an error."""
    recorded = run.record.get("logs", {}).get("batch")
    own = run.run_dir / rundir.BATCH_LOG
    if not recorded or Path(recorded) != own or not os.path.islink(own):
        return ""
    target = os.path.realpath(own)
    root = os.path.realpath(log_root(run))
    if target == root or target.startswith(root + os.sep) or not os.path.isfile(target):
        return ""  # inside (read as usual), or not a log at all (a device, a FIFO): refused as any other path
    return target


def log_sizes(run: Run, rank: int | None = None) -> dict[Path, int]:
    """How long each of the run's logs is now (``submit --resume --wait`` follows only what the new launch adds)."""
    sizes = {}
    for _, path in log_files(run, rank):
        try:
            sizes[path] = os.lstat(path).st_size
        except OSError:
            continue
    return sizes


def follow_logs(run: Run, rank: int | None, *, follow: bool, poll_s: float = 1.0,
                is_done: Callable[[], bool] | None = None, prefix: bool = True,
                since: dict[Path, int] | None = None) -> Iterator[str]:
    """Lines of the run's logs, each prefixed with its source; with ``follow``, keep reading until
    the job has ended and no new lines arrive. ``since``: start each log there (its size before a launch)."""
    files = log_files(run, rank)
    offsets = {path: (since or {}).get(path, 0) for _, path in files}
    if rank is None and (outside := outside_batch_log(run)):
        notice = f"the batch log is {outside}, outside the job's directory: not read here"
        yield f"[batch] {notice}" if prefix else notice
    while True:
        new = False
        for label, path in files:
            if not os.path.lexists(path):
                continue
            for data in _new_chunks(path, offsets):
                for line in data.decode("utf-8", errors="replace").splitlines():
                    new = True
                    yield f"[{label}] {line}" if prefix else line
        if not follow:
            return
        if not new and is_done is not None and is_done():
            return
        time.sleep(poll_s)
