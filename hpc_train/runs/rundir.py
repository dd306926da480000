"""The run directory's one owner: where runs go, what the files are called, how they are written, and
what state a run is in. Torch-free and stdlib-only (the ranks, the submit side and the local launcher
import it; the sbatch templates get its names and exit codes as template variables).

Layout: ``<runs root>/<name>/<run id>``, the run id being the Slurm job id (array task: ``<id>_<task>``)
or ``local-<time>-<pid>`` (array-like: ``_<i>``) for local runs::

    run.json        who submitted what: job id, cluster, time, version, git SHA, where the logs are
    config.json     the resolved job (JSON);  job.yaml: the same as the ranks read it
    job.sbatch      the script submitted (Slurm; a sweep point: a link to its array's one script)
    state.jsonl     one line per state change (below)
    logs/           batch.log (the batch shell or the local launcher) and rank-N.log
    ranks/          rank-N.json: what each rank saw
    metrics.jsonl, summary.json, checkpoints/, per_class_accuracy.png: the trainer's outputs

**States.** Several writers record what they know, each with one line appended to ``state.jsonl``
(appends of one short line do not tear, and no writer reads-modifies-writes another's file):

* submit: ``queued``;  the cancel command: ``cancelled``;
* the batch shell (templates/partials/run_state.j2) or the local launcher: ``running`` when an instance
  starts, ``exit`` with the launch's exit code when it ends;
* the ranks: ``failed`` with the reason (the first failing rank's message), and the trainer's
  ``running``, ``requeued``, ``preempted``, ``completed`` with its progress.

:func:`read_state` folds the lines into one :class:`RunState` — the exit code decides what an ``exit``
means (:func:`state_for_exit`) — and ``hpc-train status`` reconciles it with Slurm for what no exit block
sees (time limit, out of memory, node failure, ``scancel``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import safe_files

# File names -----------------------------------------------------------------------------------------
RUN_JSON = "run.json"
CONFIG_JSON = "config.json"
JOB_YAML = "job.yaml"
JOB_SCRIPT = "job.sbatch"
STATE_LOG = "state.jsonl"
LOGS_DIR = "logs"
BATCH_LOG = "logs/batch.log"
RANK_LOG = "logs/rank-{rank}.log"
RANKS_DIR = "ranks"
WORK_DIR = "work"
"""Where a command job runs under ``workdir: run`` (docs/commands.md): made at the run's first launch, kept after."""
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
RUN_DIR_ENV = "HPC_TRAIN_RUN_DIR"
"""Set by the batch shell and the local launcher for every rank: the run directory."""


def own_logs(run_dir: Path) -> dict[str, str]:
    """The run record's ``logs`` of a run that writes them in its own directory (a local or packed run, a
    plain ``sbatch`` of a rendered script), not in submitit's folder."""
    return {"batch": str(run_dir / BATCH_LOG), "rank_out": str(run_dir / RANK_LOG)}

# States -------------------------------------------------------------------------------------------
QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED, PREEMPTED, REQUEUED = (
    "queued", "running", "completed", "failed", "cancelled", "preempted", "requeued")
STATES = (QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED, PREEMPTED, REQUEUED)
FINAL_STATES = frozenset({COMPLETED, FAILED, CANCELLED, PREEMPTED})
"""No launch of this run is under way (``preempted`` can be continued with ``submit --resume``)."""
EXIT = "exit"
"""The event of a launch's end: its exit code decides the state."""
RANKS_EVENT = "ranks"
"""The local launcher's line naming its ranks' processes (``ranks: [[rank, pid, start_ticks], ...]``): what
``status`` and ``cancel`` check once the launcher died; :func:`fold` passes over it."""

# Exit codes: of a rank, of the launch (srun or the local launcher), of the batch script -------------------
EXIT_OK = 0
"""Done, or checkpointed and requeued (the next instance continues)."""
EXIT_FAILED = 1
"""A crash (a traceback in the rank's log)."""
EXIT_BAD_INPUT = 2
"""Bad configuration or data: one line on stderr saying what to change."""
EXIT_CHECKPOINTED = 75
"""Checkpointed after a preemption signal but not requeued (EX_TEMPFAIL): continue with --resume."""
EXIT_NOT_FOUND = 127
"""The command's program (or the SCRIPT of ``python SCRIPT``) is not there, as a shell says."""
EXIT_HUNG = 124
"""The watchdog ended a launch whose ranks made no progress for ``slurm.hang_timeout_s`` (timeout(1)'s code)."""
EXIT_HANG_REQUEUED = 125
"""The batch script's watchdog ended a hung launch and requeued the job (the batch script then exits 0)."""


def state_for_exit(code: int) -> tuple[str, str]:
    """(state, reason) of a launch that ended with ``code``, when no rank said more."""
    if code == EXIT_OK:
        return COMPLETED, ""
    if code == EXIT_CHECKPOINTED:
        return PREEMPTED, "checkpointed, not requeued"
    if code == EXIT_BAD_INPUT:
        return FAILED, "bad configuration or data (exit 2)"
    if code == EXIT_NOT_FOUND:
        return FAILED, "program not found (exit 127)"
    if code == EXIT_HUNG:
        return FAILED, "hung: no progress for slurm.hang_timeout_s (exit 124)"
    if code > 128:
        return FAILED, f"killed by signal {code - 128} (exit {code})"
    return FAILED, f"exit code {code}"


# Writing ------------------------------------------------------------------------------------------------

def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_text_atomic(path: Path, text: str, within: Path | None = None) -> None:
    """Write a file whole or not at all (temporary file in the same directory, then rename), with no symlinked
    directory below ``within`` on the way (:mod:`.safe_files`)."""
    safe_files.write_text_atomic(path, text, within)


def write_json_atomic(path: Path, data: Any, within: Path | None = None) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n", within)


def append_event(run_dir: Path | str, event: str, **fields: Any) -> None:
    """Append one state line (``queued``, ``running``, ``failed``, ``exit``, ...) to the run's state log.
    ``fields`` with a None value are left out."""
    record = {"event": event, "time": now(), **{k: v for k, v in fields.items() if v is not None}}
    line = json.dumps(record) + "\n"
    # One write of one line with O_APPEND: concurrent writers (ranks, the batch shell) never interleave; never
    # through a symlink planted as state.jsonl (it would append into any file the writer can write).
    safe_files.append_bytes(Path(run_dir) / STATE_LOG, line.encode("utf-8"), within=Path(run_dir))


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The state log's lines (a torn or foreign line is skipped). One that is not a regular file of bounded size (a
    symlink, a FIFO, a device) is a :class:`~.safe_files.RunFileError`, never a hang or an empty history."""
    try:
        text = safe_files.read_text(Path(run_dir) / STATE_LOG, safe_files.LOG_MAX_BYTES, errors="replace")
    except OSError:
        return []
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            safe_files.check_types(record, _EVENT_TYPES, f"{STATE_LOG} line {number}")
            events.append(record)
    return events


_EVENT_TYPES: dict[str, tuple[type, ...]] = {"exit_code": (int,), "restart": (int,), "instance": (str,),
                                             "time": (str,), "reason": (str,), "epoch": (int,),
                                             "global_step": (int,), "total_epochs": (int,), "step_in_epoch": (int,),
                                             "rank": (int,), "first_rank": (int,), "note": (str,)}
"""The types :func:`fold` relies on; a line with another (``"exit_code": "x"``) makes the run ``unknown`` with
the reason, never a traceback in ``status``."""




# Reading the state ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunState:
    """What the run directory says about a run."""

    state: str | None
    """One of :data:`STATES`, or None when nothing was recorded (a run submitted before this log existed)."""
    reason: str = ""
    exit_code: int | None = None
    restart: int = 0
    """Instances started before the current one (requeues, continuations)."""
    updated: str = ""
    progress: Mapping[str, Any] = field(default_factory=dict)
    """The trainer's last ``epoch``, ``global_step``, ``total_epochs`` (when it recorded them)."""
    note: str = ""
    """What went wrong with a requeue that still happened (the watchdog could not exclude the node, or release the
    job): shown by ``status`` while the job waits to run again."""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


_PROGRESS_KEYS = ("epoch", "step_in_epoch", "global_step", "total_epochs")
INSTANCE_ENV = "HPC_TRAIN_INSTANCE"
"""Set by the local launcher for its ranks: which launch of the run they belong to."""


def instance_of(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(instance id, restart count) of this process's launch: every rank and the launcher of one launch
    agree on it, so a rank's line is never mistaken for a line of an earlier or later launch."""
    from .. import launch_env  # each value checked: a broken one is exit 2 naming it, never a traceback

    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        restart = launch_env.restart_count(env, "SLURM_RESTART_COUNT")
        return f"slurm:{launch_env.job_id(env)}.{restart}", restart
    if env.get(INSTANCE_ENV):
        return env[INSTANCE_ENV], launch_env.instance_restart(env[INSTANCE_ENV], INSTANCE_ENV)
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun:{env['TORCHELASTIC_RUN_ID']}", launch_env.restart_count(env, "TORCHELASTIC_RESTART_COUNT")
    return f"pid:{os.getpid()}", 0


def fold(events: Iterable[Mapping[str, Any]]) -> RunState:
    """The state after a sequence of state lines (see the module docstring).

    A line of another launch than the current one starts afresh (a requeue, a continuation), and so does a
    ``queued`` line after the run ended (``submit --resume`` of a cancelled or preempted run: its launch has not
    started yet); within a launch the first failure is the reason (where the local launcher names the rank that
    ended first, that rank's), a cancel is final, and the exit code says how it ended."""
    state: str | None = None
    reason, exit_code, restart, updated, instance, note = "", None, 0, "", None, ""
    progress: dict[str, Any] = {}
    rank_failures: dict[Any, Mapping[str, Any]] = {}  # this launch's first failure line of each rank
    for event in events:
        name = event.get("event")
        updated = str(event.get("time", updated))
        progress.update({k: event[k] for k in _PROGRESS_KEYS if k in event})
        if event.get("instance") not in (None, instance):
            instance, restart = event["instance"], int(event.get("restart") or 0)
            state, reason, exit_code, note = RUNNING, "", None, ""
            rank_failures = {}
        if name == QUEUED:
            if state is None or state in FINAL_STATES:  # a new job continues an ended run (--resume, --chain)
                state, reason, exit_code = QUEUED, "", None
        elif name == CANCELLED:
            state, reason = CANCELLED, str(event.get("reason", ""))
        elif state in (CANCELLED,) and event.get("instance") in (None, instance):
            continue  # what this launch records after a cancel does not undo it
        elif name == RUNNING:
            if state in (None, QUEUED, REQUEUED, RUNNING):
                state = RUNNING
        elif name == FAILED and event.get("first_rank") is not None:
            # The launcher names the rank that ended first: its own line says why, if it wrote one (a rank killed
            # by a signal could not); a peer's "connection closed" written before it is a consequence.
            own = rank_failures.get(event["first_rank"], event)
            state, reason, exit_code = FAILED, str(own.get("reason", "")), own.get("exit_code", event.get("exit_code"))
        elif name == FAILED:
            if event.get("rank") is not None:
                rank_failures.setdefault(event["rank"], event)
            if state != FAILED:  # the first failing rank is the reason
                state, reason, exit_code = FAILED, str(event.get("reason", "")), event.get("exit_code")
        elif name in (COMPLETED, PREEMPTED, REQUEUED):
            if state != FAILED:
                state, reason, exit_code = name, str(event.get("reason", "")), event.get("exit_code")
                note = str(event.get("note") or "") if name == REQUEUED else ""
        elif name == EXIT:
            code = EXIT_FAILED if event.get("exit_code") is None else int(event["exit_code"])  # null: not known
            derived, why = state_for_exit(code)
            if code == EXIT_OK and state == REQUEUED:
                continue
            if state == derived and state in (FAILED, PREEMPTED):
                # Keep what the ranks said. The launch's code can be another rank's: with kill-on-bad-exit
                # srun reports the SIGTERM (143) of a rank stopped after the first one failed with 2.
                exit_code = code if exit_code is None else exit_code
            else:
                state, reason, exit_code = derived, why, code
    return RunState(state=state, reason=reason, exit_code=exit_code, restart=restart, updated=updated,
                    progress=progress, note=note)


def read_state(run_dir: Path) -> RunState:
    return fold(read_events(run_dir))


# Where runs go ------------------------------------------------------------------------------------

def runs_root(runs_dir: str, cwd: Path | None = None) -> Path:
    """The absolute directory holding run groups: ``runs_dir`` (``~`` expanded) against the submit directory.
    A '%' anywhere in it is refused: Slurm would expand it in the log paths built from it."""
    from ..errors import ConfigError

    root = Path(os.path.expanduser(runs_dir))
    root = root if root.is_absolute() else (cwd or Path.cwd()) / root
    if "%" in str(root):
        raise ConfigError(f"the runs directory {root} holds '%', which Slurm expands in log paths; "
                          "submit from another directory or pass --runs-dir")
    return root


def run_group(root: Path, name: str) -> Path:
    return root / name


def alone_run_dir(runs_dir: str, name: str) -> Path:
    """Where ``hpc-train train`` / ``python -m hpc_train.train`` run alone puts its run (``local-<time>``), relative
    to the current directory as ``runs_dir`` is written."""
    return Path(runs_dir) / name / _dt.datetime.now().strftime("local-%Y%m%d-%H%M%S")
