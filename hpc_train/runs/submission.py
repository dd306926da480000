"""What every submission writes into a run directory and shares, on Slurm or locally: its result, the code
snapshot, run.json and the run's files (undone with :mod:`.undo` when the submission is
refused: bad input or a refusal leaves nothing behind), and the checks of a ``--resume``. Choosing the cluster
is the front's (:mod:`hpc_train.front.submit`); the interpreter the ranks run, the render's
(:func:`hpc_train.render.plain.resolve_python`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from .. import __version__
from ..config import JobSources, JobSpec, dump_yaml
from ..errors import ConfigError
from . import rundir, safe_files
from .launch_lock import LOCK_FILE
from .undo import Created

@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    run_name: str
    """``<name>/<run id>``: what ``status``/``logs``/``cancel`` accept (a job id works too)."""
    run_dir: str
    cluster: Literal["slurm", "local"]
    note: str = ""
    """Anything the user should know (e.g. 'Slurm not found: running locally')."""
    tasks: tuple[str, ...] = ()
    """Array task ids (``<id>_<i>``) of a sweep, or the job ids of a chain."""
    run_dirs: tuple[str, ...] = ()
    """Every run directory the submission made or continues."""
    job: Any = field(default=None, repr=False, compare=False)
    """The submitit job handle(s) of a Slurm submission (not serialised)."""

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in ("job_id", "run_name", "run_dir", "cluster", "note", "tasks")})




def shared_filesystem_warning(path: Path) -> str | None:
    """A hint when the run directory is obviously node-local (compute nodes could not see it)."""
    text = str(path.resolve())
    for local in ("/tmp", "/var/tmp", "/dev/shm"):
        if text == local or text.startswith(local + "/"):
            return f"runs directory {text} looks node-local; compute nodes must see it (use home or project space)"
    return None


def git_sha(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


MAX_DIFF_BYTES = 5 << 20
"""A code snapshot's diff larger than this is cut (a run directory is not a repository)."""


def code_snapshot(path: Path) -> dict[str, str] | None:
    """The code a submission runs, from the submit directory's git repository: ``code.json`` (SHA, branch,
    untracked files) and ``code.diff`` (``git diff HEAD``: what is not committed). None outside git."""
    sha = git_sha(path)
    if sha is None:
        return None

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30,
                                 check=False, errors="replace")
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout if out.returncode == 0 else ""

    diff = git("diff", "HEAD")
    if len(diff.encode()) > MAX_DIFF_BYTES:
        diff = diff.encode()[:MAX_DIFF_BYTES].decode(errors="ignore") + "\n[cut at 5 MiB by hpc-train]\n"
    info = {"git_sha": sha, "branch": git("rev-parse", "--abbrev-ref", "HEAD").strip(), "dirty": bool(diff),
            "untracked": git("ls-files", "--others", "--exclude-standard").splitlines()[:1000],
            "submit_dir": str(path)}
    return {"code.json": json.dumps(info, indent=2) + "\n", "code.diff": diff}


def submission_facts() -> dict[str, Any]:
    """What every run of one submission shares in its run.json: when, from where, with which code (asked once
    per submission, not once per sweep point)."""
    return {
        "submitted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "submit_host": socket.gethostname(),
        "submit_dir": str(Path.cwd()),
        "hpc_train_version": __version__,
        "git_sha": git_sha(Path.cwd()),
    }


def run_record(spec: JobSpec, sources: JobSources, run_dir: Path, *, job_id: str, cluster: str,
               logs: Mapping[str, str], submission: Mapping[str, Any],
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """run.json: who submitted what, from where, with which code (``submission``: :func:`submission_facts`),
    and where the logs are."""
    return {
        "job_id": job_id,
        "name": spec.name,
        "run_name": f"{spec.name}/{run_dir.name}",
        "run_dir": str(run_dir),
        "cluster": cluster,
        **submission,
        "job_file": str(sources.job_file) if sources.job_file else None,
        "site_file": str(sources.site_file) if sources.site_file else None,
        "nodes": spec.slurm.nodes,
        "ranks_per_node": spec.slurm.ranks_per_node,
        "world_size": spec.slurm.world_size,
        "launcher": spec.slurm.launcher,  # torchrun: a log is a node's, not a rank's (`logs --rank`)
        **({"workdir": command_workdir(spec, run_dir, submission)} if spec.command else {}),
        "logs": dict(logs),
        **(extra or {}),
    }


def command_workdir(spec: JobSpec, run_dir: Path, submission: Mapping[str, Any]) -> str:
    """Where a command job's ranks run: its own ``<run_dir>/work`` (``workdir: run``) or the submit directory."""
    return str(run_dir / rundir.WORK_DIR) if spec.workdir == "run" else str(submission.get("submit_dir") or Path.cwd())


def write_run_files(created: Created, run_dir: Path, spec: JobSpec, record: Mapping[str, Any], *,
                    script: str | None = None, snapshot: Mapping[str, str] | None = None,
                    job_yaml: str | None = None) -> None:
    """A new run directory: the resolved job (config.json, job.yaml: ``job_yaml`` when the caller has it already),
    run.json, the script, the code snapshot (``submit --snapshot``), the launch lock's file, ``queued``."""
    created.mkdir(run_dir / rundir.LOGS_DIR)
    for name, text in (snapshot or {}).items():
        created.write(run_dir / name, text)
    if script is not None:
        created.write(run_dir / rundir.JOB_SCRIPT, script)
    created.write(run_dir / rundir.CONFIG_JSON, json.dumps(spec.to_dict(), indent=2) + "\n")
    created.write(run_dir / rundir.JOB_YAML, dump_yaml(spec) if job_yaml is None else job_yaml)
    created.write(run_dir / rundir.RUN_JSON, json.dumps(record, indent=2) + "\n")
    created.write(run_dir / LOCK_FILE, "")  # one launch at a time: launch_lock
    rundir.append_event(run_dir, rundir.QUEUED, writer="submit", job_id=record.get("job_id"))


def continue_run_record(run_dir: Path, job_id: str, logs: Mapping[str, str]) -> None:
    """A continuation (``--resume``, ``--chain``) notes its job in the run's record and its state log."""
    path = run_dir / rundir.RUN_JSON
    try:
        record = safe_files.read_json(path) if os.path.lexists(path) else {"run_dir": str(run_dir)}
    except (OSError, ValueError):
        record = {"run_dir": str(run_dir)}
    record.setdefault("continued_by", []).append({"job_id": job_id, "logs": dict(logs)})
    record["job_id"], record["logs"] = job_id, dict(logs)
    rundir.write_json_atomic(path, record, within=run_dir)
    rundir.append_event(run_dir, rundir.QUEUED, writer="submit", job_id=job_id)


def resumable(run_name: str, job_id: str, state: str, reason: str = "") -> None:
    """A run can be continued once no launch of it is queued or running (checked under its launch lock:
    :mod:`.launch_lock`); the refusal names the job that is live. A run whose state is ``unknown`` (no Slurm
    client answers here, a file of it is unreadable) may be live: refused too, saying why and what to do."""
    if state == "unknown":
        raise ConfigError(f"{run_name} is unknown (job {job_id}): {reason or 'nothing recorded'}; whether it still "
                          f"runs cannot be told here: --resume it where hpc-train status {run_name} shows it ended")
    if state not in rundir.FINAL_STATES:
        why = f": {reason}" if reason else ""
        raise ConfigError(f"{run_name} is {state} (job {job_id}){why}; wait for it to end, or hpc-train cancel "
                          f"{run_name}, before --resume")


CHECKPOINT_SHAPE = (("train", "model"), ("train", "data", "name"), ("train", "data", "num_classes"),
                    ("train", "data", "args"), ("train", "optim", "name"), ("command",), ("workdir",))
"""What a run's checkpoints hold the shape of (the model's weights, the classes, the optimizer's state), or what
the run is (its command, and its working directory, where a command's own files are): a ``--resume`` that
changes one of them could only be refused by the ranks, after ``job.yaml`` was rewritten; it is refused before
anything is written."""


def _leaves(value: Any, key: str) -> dict[str, Any]:
    """``{"train.model.name": "small_cnn", ...}``: a mapping's values by dotted key."""
    if isinstance(value, Mapping):
        return {k: v for name, item in value.items() for k, v in _leaves(item, f"{key}.{name}").items()}
    return {key: value}


def _value(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def check_continuation(run_name: str, old: JobSpec, new: JobSpec) -> None:
    """A ``--resume`` keeps what the run's checkpoints hold (:data:`CHECKPOINT_SHAPE`); else exit 2 naming the key."""
    before, after = old.to_dict(), new.to_dict()
    for path in CHECKPOINT_SHAPE:
        was, now = _leaves(_value(before, path), ".".join(path)), _leaves(_value(after, path), ".".join(path))
        changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
        if changed:
            key = changed[0]
            raise ConfigError(f"--resume {run_name} cannot change {key} ({was.get(key)!r} -> {now.get(key)!r}): the "
                              "run's checkpoints hold what it was; a new run (submit the job) starts afresh")


def continued_job_file(run_dir: Path) -> Path:
    """The job file a ``--resume`` starts from: the run's own resolved config."""
    for candidate in (run_dir / rundir.JOB_YAML, run_dir / rundir.CONFIG_JSON):  # JSON is YAML
        if candidate.exists():
            return candidate
    raise ConfigError(f"{run_dir} has neither job.yaml nor config.json; cannot resume it")
