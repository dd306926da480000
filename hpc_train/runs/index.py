"""Finding runs: by name (``digits-lt-demo/4242``), job id, run directory or job name (its latest run),
wherever their job's ``runs_dir`` put them.

Two places are looked at: the runs root of the layered configuration (``--runs-dir``, else the site
file's ``runs_dir``, else ``./runs``), and the user's run index — one line per submitted run, appended
by ``submit`` (``$HPC_TRAIN_STATE_DIR/runs.jsonl``, default ``~/.local/state/hpc-train/``), which knows
the runs of job files with their own ``runs_dir``. Listing (``hpc-train status``) shows the runs under
the root and the indexed runs submitted from this directory; a name or id is found anywhere. Past
:data:`PRUNE_AT_BYTES` the index drops the lines of runs whose directory was deleted.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import ConfigError
from . import rundir, safe_files

STATE_DIR_ENV = "HPC_TRAIN_STATE_DIR"
_DIGITS = re.compile(r"(\d+)")  # a run name's numbers, compared as numbers (order_key)


@dataclass(frozen=True)
class Run:
    run_dir: Path
    record: Mapping[str, Any]
    unreadable: str = ""
    """Why its run.json cannot be read ("" when it can, or when there is none: a plain ``sbatch``)."""

    @property
    def job_id(self) -> str:
        return str(self.record.get("job_id") or self.run_dir.name)

    @property
    def on_slurm(self) -> bool:
        """Slurm knows its job: a run whose run.json cannot be read names no job Slurm could be asked about."""
        return not self.unreadable and self.cluster != "local"

    @property
    def name(self) -> str:
        return f"{self.run_dir.parent.name}/{self.run_dir.name}"

    @property
    def cluster(self) -> str:
        return "unknown" if self.unreadable else str(self.record.get("cluster", "slurm"))


def index_path() -> Path:
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]) / "runs.jsonl"
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "hpc-train" / "runs.jsonl"


PRUNE_AT_BYTES = 1 << 20
"""An index this large (about 7,000 runs) drops the lines of runs whose directory is gone."""


def check_writable() -> None:
    """Before anything is queued: the run index can be written (``status``, ``logs`` and ``--resume`` find runs
    through it), else exit 2 saying where; a submission never queues a run it could not record. The probe leaves
    nothing behind (directories it made are removed again; ``register`` makes them for good)."""
    path = index_path()
    missing, existing = [], path.parent
    while not existing.exists() and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    made: list[Path] = []
    try:
        for directory in reversed(missing):
            directory.mkdir()
            made.append(directory)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
        if os.path.lexists(path) and (path.is_symlink() or not (path.is_file() and os.access(path, os.W_OK))):
            raise OSError(0, "not a writable file")
    except OSError as exc:
        raise ConfigError(f"cannot record runs in {path} ({exc.strerror or exc}); set ${STATE_DIR_ENV} to a "
                          "directory you can write") from None
    finally:
        for directory in reversed(made):
            try:
                directory.rmdir()
            except OSError:
                pass


def register(run_dirs: list[Path], submit_dir: Path, prune_at_bytes: int = PRUNE_AT_BYTES) -> str | None:
    """Add submitted runs to the index; a warning (not an error: the job is queued already) when it cannot."""
    path = index_path()
    lines = "".join(json.dumps({"run_dir": str(d), "submit_dir": str(submit_dir), "time": rundir.now()}) + "\n"
                    for d in run_dirs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # One lock for appending and pruning: a prune replaces the file, and a line appended meanwhile to
        # the replaced one would be lost. Readers need none (the replacement is a rename).
        lock = safe_files.open_append(path.with_name(path.name + ".lock"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            safe_files.append_bytes(path, lines.encode("utf-8"))  # never through a symlink planted as the index
            if path.stat().st_size > prune_at_bytes:
                _prune(path)
        finally:
            os.close(lock)
    except (OSError, safe_files.RunFileError) as exc:
        return f"could not record the run in {path} ({getattr(exc, 'strerror', None) or exc}); find it with --runs-dir"
    return None


def _prune(path: Path) -> None:
    """Keep the lines of runs whose directory still exists (deleted runs are never found again anyway)."""
    text = safe_files.read_text(path, safe_files.LOG_MAX_BYTES, errors="replace")
    rundir.write_text_atomic(path, "".join(line + "\n" for line, entry in _entries(text)
                                           if is_run_dir(Path(entry["run_dir"]))))


def _entries(text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The index's lines that name a run directory, with what they say (a torn or foreign line is skipped)."""
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("run_dir"), str):
            yield line, entry


def _indexed(submit_dir: Path | None = None) -> list[Path]:
    try:
        text = safe_files.read_text(index_path(), safe_files.LOG_MAX_BYTES, errors="replace")
    except OSError:
        return []
    found: dict[str, None] = {}
    for _, entry in _entries(text):
        if submit_dir is None or entry.get("submit_dir") == str(submit_dir):
            found[entry["run_dir"]] = None
    return [Path(p) for p in found if is_run_dir(Path(p))]


def is_run_dir(path: Path) -> bool:
    try:
        return path.is_dir() and any(os.path.lexists(path / name) for name in (rundir.RUN_JSON, rundir.JOB_YAML))
    except (OSError, ValueError):  # a name too long for a path, a NUL byte: a selector, never a run directory
        return False


def load_run(run_dir: Path) -> Run:
    """The run of ``run_dir``; one whose run.json cannot be read is still listed, as unreadable (never taken
    for a plain ``sbatch``, whose job id the directory name would be: ``cancel`` would scancel that)."""
    path = run_dir / rundir.RUN_JSON
    if not os.path.lexists(path):  # a plain `sbatch` of a rendered script, or `hpc-train train` run alone
        return _unrecorded_run(run_dir)
    try:
        record = safe_files.read_json(path)  # a regular file of bounded size: never a FIFO's hang
    except safe_files.RunFileError as exc:
        return Run(run_dir, {}, unreadable=f"{rundir.RUN_JSON} unreadable ({exc})")
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return Run(run_dir, {}, unreadable=f"{rundir.RUN_JSON} unreadable ({exc.__class__.__name__})")
    if not isinstance(record, dict) or not record:
        return Run(run_dir, {}, unreadable=f"{rundir.RUN_JSON} unreadable (not a run record)")
    wrong = _wrong_types(record)
    if wrong:
        return Run(run_dir, {}, unreadable=f"{rundir.RUN_JSON} unreadable ({wrong})")
    return Run(run_dir=run_dir, record=record)


_SLURM_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")


def _unrecorded_run(run_dir: Path) -> Run:
    """A run no submit recorded: a plain ``sbatch`` of a rendered script (its directory is its Slurm job id), or
    ``hpc-train train`` / ``python -m hpc_train.train`` run alone (``local-<time>``): no scheduler knows it, so it is
    never asked about (it showed ``completed (slurm state UNKNOWN …)``), and its rank 0's pid tells whether it
    still runs (one killed by SIGPIPE stayed ``running`` forever)."""
    logs = rundir.own_logs(run_dir)
    if _SLURM_JOB_ID.fullmatch(run_dir.name):
        return Run(run_dir, {"job_id": run_dir.name, "cluster": "slurm", "logs": logs})
    record: dict[str, Any] = {"job_id": run_dir.name, "cluster": "local", "logs": logs, "alone": True}
    try:
        rank0 = safe_files.read_json(run_dir / rundir.RANKS_DIR / "rank-0.json")
        if isinstance(rank0, dict) and isinstance(rank0.get("pid"), int) and not isinstance(rank0["pid"], bool):
            record["launcher_pid"] = rank0["pid"]
    except (OSError, ValueError, safe_files.RunFileError):
        pass
    return Run(run_dir, record)


_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "job_id": (str, int), "cluster": (str,), "submitted_at": (str,), "world_size": (int,), "launcher_pid": (int,),
    "array_job_id": (str, int), "sweep_id": (str, int), "array_job_ids": (list,), "logs": (dict,), "pack": (int,),
    "ranks_per_node": (int,), "launcher": (str,)}
"""The run record's fields that status, logs, cancel and report read, and the types they read them as."""


def _wrong_types(record: Mapping[str, Any]) -> str:
    """What in a run record has a type the readers do not expect ("" when nothing): such a run is listed as
    ``unknown`` with this reason, never a traceback for everyone's ``status``."""
    problem = safe_files.wrong_type(record, _RECORD_TYPES)
    if problem:
        return problem
    logs = record.get("logs") or {}
    if not all(isinstance(v, str) for v in logs.values()):
        return "logs holds a value that is not a path"
    if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in record.get("array_job_ids") or []):
        return "array_job_ids holds a value that is not a job id"
    return ""


def _under(root: Path) -> list[Path]:
    found = []
    if root.is_dir():
        for group in sorted(root.iterdir()):
            if group.is_dir() and not group.name.startswith("."):
                found.extend(d for d in sorted(group.iterdir()) if is_run_dir(d))
    return found


def order_key(run: Run) -> tuple[Any, ...]:
    """The order ``status`` and ``report`` list runs in: oldest submission first, a sweep's points by number
    (``_10`` after ``_9``). A run's directory mtime moves whenever a rank writes into it, so it only dates a run
    without ``submitted_at`` (a plain ``sbatch`` of a rendered script)."""
    when = str(run.record.get("submitted_at") or "") or _dt.datetime.fromtimestamp(
        run.run_dir.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
    name = tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(run.run_dir.name))
    return when, run.run_dir.parent.name, name


def _sorted_runs(paths: list[Path]) -> list[Run]:
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    return sorted((load_run(p) for p in unique), key=order_key)


def all_runs(root: Path) -> list[Run]:
    """Every run under ``root`` and in the index, oldest first."""
    return _sorted_runs(_under(root) + _indexed())


def find_runs(root: Path, cwd: Path | None = None) -> list[Run]:
    """The runs under ``root`` and the indexed runs submitted from ``cwd``, oldest first."""
    return _sorted_runs(_under(root) + _indexed((cwd or Path.cwd()).resolve()))


_MEANINGLESS = frozenset("/._-*?[]{}~!^$ \t\n\r\f\v")
"""Characters a selector made only of names nothing: separators, glob and regex wildcards, blanks. A selector of
these alone (``''`` from an unset ``"$RUN"``, ``/``, ``_*``) would otherwise match whichever run came last."""


def is_job_dir(path: Path) -> bool:
    """A job's directory of runs (what ``report`` takes as all its runs): a directory holding a run's job.yaml."""
    try:
        return path.is_dir() and any((d / rundir.JOB_YAML).is_file() for d in path.iterdir() if d.is_dir())
    except (OSError, ValueError):
        return False


def check_selector(ref: str, what: str = "RUN", names_a_path: Callable[[Path], bool] = is_run_dir) -> str:
    """``ref`` as given, when it can name a run; exit 2 when it names nothing (empty, or made only of separators,
    wildcards or blanks). Selectors never guess: ``cancel ''`` must not cancel the latest run. A path is a
    selector like any other (``.`` inside a run directory, ``../RUN``): one ``names_a_path`` accepts (a run
    directory; for ``report`` a job's directory of runs too) names what it is, whatever its characters."""
    if ref and names_a_path(Path(ref)):
        return ref
    if not ref or set(ref) <= _MEANINGLESS:
        where = ""
        if ref and os.path.isdir(ref):  # `.`, `..`: say where it points, since it is not what a selector names
            where = f": {ref} is {Path(ref).resolve()}, not a run directory (it has no {rundir.RUN_JSON})"
        raise ConfigError(f"{what} {ref!r} names no run{where}; give a run name (NAME/ID), a job id, a run "
                          "directory or a job name")
    return ref


def _candidates(runs: list[Run], limit: int = 8) -> str:
    """The runs a selector fits, as the user can name each one exactly: its run directory."""
    names = [str(r.run_dir) for r in runs]
    shown = ", ".join(names[-limit:])
    return shown if len(names) <= limit else f"{shown} (and {len(names) - limit} more)"


def of_one_job(ref: str, matches: list[Run]) -> list[Run]:
    """``matches`` when they are all runs of one job (one directory of runs), else exit 2 listing them: a name that
    fits runs of several jobs is never settled by taking the latest."""
    groups = {r.run_dir.parent.resolve() for r in matches}
    if len(groups) > 1:
        raise ConfigError(f"{ref!r} fits runs of {len(groups)} jobs: {_candidates(matches)}; name one by its run "
                          "directory")
    return matches


def matching(ref: str, runs: list[Run], ids: Callable[[Run], set[str]]) -> list[Run]:
    """The runs ``ref`` names, by the first rule any run fits: its run name (``name/id``); else ``[name/]id``, an id
    ``ids`` gives the run (its job id, directory name; for ``report`` its array's too); else a job name (all its
    runs). Runs of several jobs are never a match: exit 2 listing them (:func:`of_one_job`)."""
    name, _, ident = ref.rpartition("/")
    for fits in (lambda r: r.name == ref, lambda r: (not name or r.run_dir.parent.name == name) and ident in ids(r),
                 lambda r: r.run_dir.parent.name == ref):
        found = [r for r in runs if fits(r)]
        if found:
            return of_one_job(ref, found)
    return []


def resolve_run(ref: str, root: Path) -> Run:
    """A run by path, ``name/run id``, job id (``4242``, ``4242_1``) or job name (its latest run), under
    ``root`` or anywhere in the index. A selector that names nothing, or fits runs of several jobs, is exit 2
    with the candidates: it never picks one."""
    check_selector(ref)
    path = Path(ref)
    if is_run_dir(path):
        return load_run(path.resolve())  # `.` or `../RUN` as given would name no run (nor its job) of its own
    runs = all_runs(root)
    matches = matching(ref, runs, ids=lambda r: {r.job_id, r.run_dir.name})
    if matches:
        return matches[-1]
    known = ", ".join(r.name for r in runs[-5:]) or "none"
    raise ConfigError(f"no run {ref!r} under {root} or in the run index; recent runs: {known}")
