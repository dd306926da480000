"""``hpc-train report``: one table over the runs of a sweep (or any runs) — the long-tail results as
configurations × seeds.

A row per configuration: the runs grouped by the job keys that differ between them, except the seed keys
(``train.seed`` by default). For each configuration, over its seeds: the mean and the *sample* standard
deviation (ddof 1; none with one run) of top-1, balanced, many, medium and few accuracy and the expected
calibration error at the last evaluated epoch (the headline), at the best epoch on the held-out split (``best``,
only with one) and at the best test top-1 (``best_on_test``: chosen on the test split, so not an estimate of
it), and how many runs finished, are running, failed. It reads each run's ``metrics.jsonl``, so it works while
runs are still going. Torch-free and numpy-free.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import ConfigError
from . import rundir, safe_files
from .index import Run, all_runs, check_selector, is_job_dir, is_run_dir, load_run, matching, order_key

@dataclass(frozen=True)
class Column:
    """A figure of an evaluation record (``metrics.jsonl``), a column of the report: mean ± std over seeds."""

    key: str
    header: str


@dataclass(frozen=True)
class Row:
    """An epoch the report shows a configuration at: which evaluation of each run it takes."""

    name: str
    pick: Callable[["RunResult"], "dict[str, Any] | None"]


COLUMNS: list[Column] = [Column("top1", "top-1"), Column("balanced", "balanced"), Column("many", "many"),
                         Column("medium", "medium"), Column("few", "few"), Column("ece", "ECE")]
"""The report's columns, in order; another figure (a calibration error) is one more Column."""
ROWS: list[Row] = [Row("last", lambda r: r.last), Row("best", lambda r: r.best),
                   Row("best_on_test", lambda r: r.best_on_test)]
"""The epochs each configuration is shown at, in order: the last (the headline), the best on the held-out split
(runs with one), the best test top-1; another choice of epoch is one more Row."""
STD_NOTE = "sample standard deviation (ddof 1) over seeds"
FINISHED, RUNNING, FAILED = "finished", "running", "failed"
_BUCKETS = {rundir.COMPLETED: FINISHED, rundir.RUNNING: RUNNING, rundir.QUEUED: RUNNING, rundir.REQUEUED: RUNNING}


@dataclass
class RunResult:
    run: Run
    config: dict[str, Any]
    state: str
    best: dict[str, Any] | None
    last: dict[str, Any] | None
    train_counts: list[int] = field(default_factory=list)
    best_on_test: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    """Wall time of all its launches (requeued attempts and continuations included)."""
    stragglers: list[dict[str, Any]] = field(default_factory=list)


def launch_seconds(events: Sequence[Mapping[str, Any]], now: float | None = None) -> float:
    """Wall seconds of every launch a run's state log records: from each launcher's ``running`` to that launch's
    last line (its ``exit``, or whatever it wrote last when it was killed); a launch still running counts to now."""
    def stamp(event: Mapping[str, Any]) -> float | None:
        try:
            return _dt.datetime.fromisoformat(str(event["time"])).timestamp()
        except (KeyError, ValueError):
            return None

    spans: dict[str, list[float]] = {}
    ended: set[str] = set()
    for event in events:
        instance, when = event.get("instance"), stamp(event)
        if not instance or when is None:
            continue
        if event.get("event") == rundir.RUNNING and event.get("writer") == "launcher" and instance not in spans:
            spans[instance] = [when, when]
        elif instance in spans:
            spans[instance][1] = max(spans[instance][1], when)
            ended |= {instance} if event.get("event") in (rundir.EXIT, rundir.REQUEUED, rundir.CANCELLED) else set()
    if spans and (last := max(spans, key=lambda i: spans[i][0])) not in ended and events[-1].get("event") in (
            rundir.RUNNING, rundir.QUEUED, rundir.RANKS_EVENT):  # still under way
        spans[last][1] = max(spans[last][1], time.time() if now is None else now)
    return sum(end - start for start, end in spans.values())


def gpus_of(config: Mapping[str, Any]) -> float:
    """GPUs a run holds: nodes x GPUs per node (0 for CPU runs), shared by the ``slurm.pack`` runs packed into
    one array task (they run side by side on its allocation)."""
    gpus = int(config.get("slurm.nodes") or 1) * int(config.get("slurm.gpus_per_node") or 0)
    return gpus / max(1, int(config.get("slurm.pack") or 1))


def _gpu_hours(row: Mapping[str, Any]) -> str | None:
    return f"{row['gpu_hours']:.2f} GPU-hours ({row['elapsed_s'] / 3600:.2f} h elapsed in all)"


def _stragglers(row: Mapping[str, Any]) -> str | None:
    named = [f"{s['run']} rank {s['rank']} on {s['host']} (in {s['epochs']} of {s['of_epochs']} epochs, up to "
             f"{s['max_ratio']:.1f}x the median compute time)" for s in row["stragglers"]]
    return ("stragglers: " + "; ".join(named)) if named else None


@dataclass(frozen=True)
class Summary:
    """A line under a configuration's counts (GPU-hours, stragglers): its text from the configuration's data."""

    key: str
    text: Callable[[Mapping[str, Any]], str | None]


SUMMARIES: list[Summary] = [Summary("gpu_hours", _gpu_hours), Summary("stragglers", _stragglers)]
"""What follows a configuration's counts line, in order; another figure per configuration is one more Summary."""


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"seed": 0}}`` → ``{"train.seed": 0}``; lists as JSON text (comparable, hashable)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):  # an empty mapping (a plug-in's args) is no key at all
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value
    return out


def evaluations(run_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluation records of training (main and cRT), one per (phase, epoch): a requeued run that
    evaluated an epoch again keeps the later record."""
    try:
        lines = safe_files.read_text(run_dir / rundir.METRICS, safe_files.LOG_MAX_BYTES, "replace").splitlines()
    except OSError:
        return []
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(record, dict) and record.get("phase") in ("main", "crt") and "epoch" in record:
            _check_evaluation(record)
            found.pop((record["phase"], record["epoch"]), None)
            found[(record["phase"], record["epoch"])] = record
    return sorted(found.values(), key=lambda r: (r.get("global_step", 0), r["epoch"]))


_NUMBERS = {key: safe_files.NUMBER for key in ("epoch", "global_step", "top1", "balanced", "many", "medium", "few",
                                                "ece")}


def _check_evaluation(record: Mapping[str, Any]) -> None:
    """An evaluation line's figures are numbers (a planted ``"top1": "x"`` makes the run's report row say so,
    never a traceback)."""
    safe_files.check_types(record, {**_NUMBERS, "val": (dict,)}, run_file(record))
    if record.get("val") is not None:
        safe_files.check_types(record["val"], _NUMBERS, f"{run_file(record)} val")


def run_file(record: Mapping[str, Any]) -> str:
    return f"{rundir.METRICS} (epoch {record.get('epoch')!r:.20})"


def _first_best(records: Sequence[Mapping[str, Any]], score: Callable[[Mapping[str, Any]], float]) -> dict | None:
    best = None
    for record in records:
        if best is None or score(record) > score(best):
            best = record
    return None if best is None else dict(best)


def best_and_last(records: Sequence[Mapping[str, Any]]) -> tuple[dict | None, dict | None, dict | None]:
    """The trainer's choices (first of equals): the best epoch on the held-out split (None without one), the last
    one, and the best test top-1 (``best_on_test``)."""
    if not records:
        return None, None, None

    def value(v: Any) -> float:
        return -math.inf if v is None else float(v)

    held_out = [r for r in records if isinstance(r.get("val"), Mapping)]
    best = _first_best(held_out, lambda r: value(r["val"]["balanced"]))
    return best, dict(records[-1]), _first_best(records, lambda r: value(r.get("top1")))


def _config(run_dir: Path) -> dict[str, Any]:
    for name in (rundir.CONFIG_JSON, rundir.JOB_YAML):
        path = run_dir / name
        if path.is_file():
            try:
                from ..config import spec_from_yaml_text

                return spec_from_yaml_text(safe_files.read_text(path), str(path)).to_dict()
            except Exception:  # noqa: BLE001 - an old or foreign run: take its JSON as it is
                try:
                    return safe_files.read_json(path)
                except (OSError, ValueError, safe_files.RunFileError):
                    continue
    return {}


def _train_counts(run_dir: Path) -> list[int]:
    try:
        return [int(c) for c in safe_files.read_json(run_dir / "class_counts.json")["train_counts"]]
    except (OSError, ValueError, KeyError, TypeError, safe_files.RunFileError):
        return []


def load(run: Run, state: str) -> RunResult:
    from .status import stragglers_of_run

    best, last, on_test = best_and_last(evaluations(run.run_dir))
    return RunResult(run, flatten(_config(run.run_dir)), state, best, last, _train_counts(run.run_dir), on_test,
                     elapsed_s=launch_seconds(rundir.read_events(run.run_dir)), stragglers=stragglers_of_run(run.run_dir))


def _ids(run: Run) -> set[str]:
    """The ids a run answers to: its job id, directory name, and its array's or sweep's id where it has one (a
    missing one is no id: ``report None`` must not select every run without an array)."""
    ids = {run.job_id, run.run_dir.name, run.record.get("array_job_id"), run.record.get("sweep_id")}
    return {str(i) for i in ids if i not in (None, "")}


def select(refs: Sequence[str], root: Path) -> list[Run]:
    """The runs ``refs`` name: a run directory or a job's directory of runs, a run name (``name/id``), a job id
    or array job id (every task), ``name/<array id>`` (that array's runs), or a job name (all its runs)."""
    runs = all_runs(root)
    chosen: dict[Path, Run] = {}
    for ref in refs:
        check_selector(ref, names_a_path=lambda p: is_run_dir(p) or is_job_dir(p))
        path = Path(ref)
        if is_run_dir(path):
            found = [load_run(path.resolve())]
        elif is_job_dir(path):
            found = [load_run(d.resolve()) for d in sorted(path.iterdir()) if (d / rundir.JOB_YAML).is_file()]
        else:
            found = matching(ref, runs, ids=_ids)
        if not found:
            raise ConfigError(f"no runs for {ref!r} under {root} or in the run index (a run, job id, array id or "
                              "job name)")
        chosen.update((r.run_dir, r) for r in found)
    return list(chosen.values())


def _stats(values: Sequence[float]) -> dict[str, Any]:
    mean = statistics.fmean(values) if values else None
    std = statistics.stdev(values) if len(values) >= 2 else None
    return {"mean": mean, "std": std, "n": len(values), "values": list(values)}


def _seed_order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value))


def _configurations(results: Sequence[RunResult], config_keys: Sequence[str],
                    seed_keys: Sequence[str]) -> list[list[RunResult]]:
    """The runs grouped by configuration: configurations in sweep order (of their first point), each one's runs
    by seed."""
    groups: dict[str, list[RunResult]] = {}
    for result in sorted(results, key=lambda r: order_key(r.run)):
        groups.setdefault(json.dumps([result.config.get(k) for k in config_keys]), []).append(result)
    return [sorted(members, key=lambda m: tuple(_seed_order(m.config.get(k)) for k in seed_keys))
            for members in groups.values()]


def _row(members: Sequence[RunResult], config_keys: Sequence[str], seed_keys: Sequence[str]) -> dict[str, Any]:
    counts = {FINISHED: 0, RUNNING: 0, FAILED: 0}
    states: dict[str, int] = {}
    for m in members:
        counts[_BUCKETS.get(m.state, FAILED)] += 1
        states[m.state] = states.get(m.state, 0) + 1
    row: dict[str, Any] = {
        "config": {k: members[0].config.get(k) for k in config_keys},
        "runs": [m.run.name for m in members],
        "seeds": [{k: m.config.get(k) for k in seed_keys if k in m.config} for m in members],
        "counts": counts, "states": states,
        "epochs": [m.last["epoch"] if m.last else None for m in members],
        "elapsed_s": sum(m.elapsed_s for m in members),
        "gpu_hours": sum(m.elapsed_s * gpus_of(m.config) for m in members) / 3600,
        "runs_gpu_hours": [round(m.elapsed_s * gpus_of(m.config) / 3600, 4) for m in members],
        "stragglers": [{"run": m.run.name, **s} for m in members for s in m.stragglers],
    }
    for which in ROWS:
        picked = [which.pick(m) for m in members]
        row[which.name] = {c.key: _stats([float(p[c.key]) for p in picked if p is not None and p.get(c.key) is not None])
                           for c in COLUMNS}
    return row


def summarise(results: Sequence[RunResult], seed_keys: Sequence[str] = ("train.seed",)) -> dict[str, Any]:
    """The report as data (``--json``): the configurations (in sweep order), their runs (by seed), counts and
    statistics."""
    keys = sorted({k for r in results for k in r.config})
    varied = [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in results}) > 1]
    config_keys = [k for k in varied if k not in seed_keys]
    rows = [_row(members, config_keys, seed_keys) for members in _configurations(results, config_keys, seed_keys)]
    return {"runs": len(results), "config_keys": config_keys, "seed_keys": list(seed_keys),
            "std": STD_NOTE, "unit": "fraction (text output: percent)", "rows": [r.name for r in ROWS],
            "columns": [c.key for c in COLUMNS], "configurations": rows}


def _cell(stats: Mapping[str, Any]) -> str:
    if stats["mean"] is None:
        return "-"
    text = f"{100 * stats['mean']:.2f}"
    return text + (f" ± {100 * stats['std']:.2f}" if stats["std"] is not None else "")


def format_report(report: Mapping[str, Any]) -> str:
    rows = report["configurations"]
    seeds = ", ".join(report["seed_keys"])
    total = sum(row["gpu_hours"] for row in rows)
    lines = [f"{report['runs']} run(s) in {len(rows)} configuration(s); accuracy and ECE (%) as mean ± sample std "
             f"(ddof 1) over {seeds}; {total:.2f} GPU-hours in all"]
    width = 16
    for row in rows:
        label = ", ".join(f"{k}={_value(v)}" for k, v in row["config"].items()) or "(all runs alike)"
        c = row["counts"]
        epochs = sorted({e for e in row["epochs"] if e is not None})
        shown_epochs = "-" if not epochs else str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
        seed_values = ", ".join(" ".join(str(v) for v in s.values()) for s in row["seeds"])
        lines += ["", label,
                  f"  {len(row['runs'])} run(s): {c[FINISHED]} finished, {c[RUNNING]} running, {c[FAILED]} failed; "
                  f"seeds {seed_values or '-'}; epochs {shown_epochs}",
                  *[f"  {text}" for part in SUMMARIES if (text := part.text(row))],
                  "  " + "epoch".ljust(12) + "".join(col.header.rjust(width) for col in COLUMNS)]
        for which in ROWS:
            cells = row[which.name]
            if any(cells[col.key]["n"] for col in COLUMNS):  # "best" only where the runs have a held-out split
                lines.append("  " + which.name.ljust(12)
                             + "".join(_cell(cells[col.key]).rjust(width) for col in COLUMNS))
    return "\n".join(lines) + "\n"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def curves(results: Sequence[RunResult], report: Mapping[str, Any]) -> tuple[list[Any], list[str]]:
    """Per configuration, per-class accuracy (%) at the last epoch over its seeds (mean, sample std), and the
    configurations that have no finished run with per-class figures (left out of the picture, and named)."""
    from .plots import Curve

    by_name = {r.run.name: r for r in results}
    drawn, left_out = [], []
    for row in report["configurations"]:
        label = ", ".join(f"{k.split('.', 1)[-1]}={_value(v)}" for k, v in row["config"].items()) or "all runs"
        members = [by_name[n] for n in row["runs"] if by_name[n].last and by_name[n].train_counts
                   and by_name[n].state == rundir.COMPLETED]
        if not members:
            states = ", ".join(f"{n} {state}" for state, n in row["states"].items())
            left_out.append(f"{label} ({states})")
            continue
        counts = members[0].train_counts
        points = []
        for i, count in enumerate(counts):
            values = [100 * m.last["per_class"][i] for m in members
                      if len(m.last.get("per_class") or []) > i and m.last["per_class"][i] is not None]
            if values:
                points.append((count, statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None))
        drawn.append(Curve(label, len(members), tuple(sorted(points))))
    return drawn, left_out


def plot(results: Sequence[RunResult], report: Mapping[str, Any], path: Path) -> None:
    """Per-class accuracy at the last epoch against training images: a line per configuration (mean over seeds)
    in a band of ± one sample std, the many / medium / few regions, a title saying so, and the configurations
    that could not be drawn named beneath."""
    try:
        from . import plots

        plots.pyplot()
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'hpc-train[plot]'") from None
    drawn, left_out = curves(results, report)
    seeds = ", ".join(report["seed_keys"])
    title = (f"per-class test accuracy at the last epoch: mean ± sample std over {seeds}\n"
             f"{sum(c.seeds for c in drawn)} finished run(s) in {len(drawn)} of {len(report['configurations'])} "
             "configuration(s)")
    figure = plots.sweep_figure(drawn, left_out, title)
    try:
        plots.save(figure, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
