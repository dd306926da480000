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

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import ConfigError
from . import rundir
from .index import Run, all_runs, is_run_dir, load_run

METRICS = ("top1", "balanced", "many", "medium", "few", "ece")
HEADERS = {"top1": "top-1", "balanced": "balanced", "many": "many", "medium": "medium", "few": "few", "ece": "ECE"}
SELECTIONS = ("last", "best", "best_on_test")
"""The epochs reported: the last (the headline), the best on the held-out split, the best test top-1."""
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
        lines = (run_dir / rundir.METRICS).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(record, dict) and record.get("phase") in ("main", "crt") and "epoch" in record:
            found.pop((record["phase"], record["epoch"]), None)
            found[(record["phase"], record["epoch"])] = record
    return sorted(found.values(), key=lambda r: (r.get("global_step", 0), r["epoch"]))


def _first_best(records: Sequence[Mapping[str, Any]], score) -> dict | None:
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

                return spec_from_yaml_text(path.read_text(encoding="utf-8"), str(path)).to_dict()
            except Exception:  # noqa: BLE001 - an old or foreign run: take its JSON as it is
                try:
                    return json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
    return {}


def _train_counts(run_dir: Path) -> list[int]:
    try:
        return [int(c) for c in json.loads((run_dir / "class_counts.json").read_text())["train_counts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def load(run: Run, state: str) -> RunResult:
    best, last, on_test = best_and_last(evaluations(run.run_dir))
    return RunResult(run, flatten(_config(run.run_dir)), state, best, last, _train_counts(run.run_dir), on_test)


def select(refs: Sequence[str], root: Path) -> list[Run]:
    """The runs ``refs`` name: a run directory or a job's directory of runs, a run name (``name/id``), a job id
    or array job id (every task), ``name/<array id>`` (that array's runs), or a job name (all its runs)."""
    runs = all_runs(root)
    chosen: dict[Path, Run] = {}
    for ref in refs:
        path = Path(ref)
        if is_run_dir(path):
            found = [load_run(path.resolve())]
        elif path.is_dir() and any((d / rundir.JOB_YAML).is_file() for d in path.iterdir() if d.is_dir()):
            found = [load_run(d.resolve()) for d in sorted(path.iterdir()) if (d / rundir.JOB_YAML).is_file()]
        else:
            name, _, ident = ref.rpartition("/")
            found = [r for r in runs if r.name == ref] or [
                r for r in runs if (not name or r.run_dir.parent.name == name)
                and ident in (r.job_id, r.run_dir.name, str(r.record.get("array_job_id")))] or [
                r for r in runs if r.run_dir.parent.name == ref]
        if not found:
            raise ConfigError(f"no runs for {ref!r} under {root} or in the run index (a run, job id, array id or "
                              "job name)")
        chosen.update((r.run_dir, r) for r in found)
    return list(chosen.values())


def _stats(values: Sequence[float]) -> dict[str, Any]:
    mean = statistics.fmean(values) if values else None
    std = statistics.stdev(values) if len(values) >= 2 else None
    return {"mean": mean, "std": std, "n": len(values), "values": list(values)}


def summarise(results: Sequence[RunResult], seed_keys: Sequence[str] = ("train.seed",)) -> dict[str, Any]:
    """The report as data (``--json``): the configurations, their runs, counts and statistics."""
    keys = sorted({k for r in results for k in r.config})
    varied = [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in results}) > 1]
    config_keys = [k for k in varied if k not in seed_keys]
    groups: dict[str, list[RunResult]] = {}
    for result in sorted(results, key=lambda r: r.run.name):
        label = json.dumps([result.config.get(k) for k in config_keys])
        groups.setdefault(label, []).append(result)
    rows = []
    for members in groups.values():
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
        }
        for which in SELECTIONS:
            row[which] = {metric: _stats([float(getattr_or(m, which, metric)) for m in members
                                          if getattr_or(m, which, metric) is not None]) for metric in METRICS}
        rows.append(row)
    return {"runs": len(results), "config_keys": config_keys, "seed_keys": list(seed_keys),
            "std": STD_NOTE, "unit": "fraction (text output: percent)", "configurations": rows}


def getattr_or(result: RunResult, which: str, metric: str) -> float | None:
    record = getattr(result, which)
    return None if record is None else record.get(metric)


def _cell(stats: Mapping[str, Any]) -> str:
    if stats["mean"] is None:
        return "-"
    text = f"{100 * stats['mean']:.2f}"
    return text + (f" ± {100 * stats['std']:.2f}" if stats["std"] is not None else "")


def format_report(report: Mapping[str, Any]) -> str:
    rows = report["configurations"]
    seeds = ", ".join(report["seed_keys"])
    lines = [f"{report['runs']} run(s) in {len(rows)} configuration(s); accuracy and ECE (%) as mean ± sample std "
             f"(ddof 1) over {seeds}"]
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
                  "  " + "epoch".ljust(12) + "".join(HEADERS[m].rjust(width) for m in METRICS)]
        for which in SELECTIONS:
            if any(row[which][m]["n"] for m in METRICS):  # "best" only where the runs have a held-out split
                lines.append("  " + which.ljust(12) + "".join(_cell(row[which][m]).rjust(width) for m in METRICS))
    return "\n".join(lines) + "\n"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def plot(results: Sequence[RunResult], report: Mapping[str, Any], path: Path) -> None:
    """Per-class accuracy (last epoch, mean over seeds) against training images, one line per configuration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'hpc-train[plot]'") from None
    by_name = {r.run.name: r for r in results}
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for row in report["configurations"]:
        members = [by_name[n] for n in row["runs"] if by_name[n].last and by_name[n].train_counts]
        if not members:
            continue
        counts = members[0].train_counts
        per_class = [_mean_or_none(m.last.get("per_class", [None] * len(counts))[i] for m in members)
                     for i in range(len(counts))]
        pairs = sorted((n, 100 * a) for n, a in zip(counts, per_class) if a is not None)
        label = ", ".join(f"{k.split('.', 1)[-1]}={_value(v)}" for k, v in row["config"].items()) or "runs"
        ax.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", ms=3, label=f"{label} (n={len(members)})")
    ax.set_xscale("log")
    ax.set_xlabel("training images of the class")
    ax.set_ylabel("test accuracy (%), last epoch, mean over seeds")
    ax.set_ylim(-2, 102)
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _mean_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None
