"""``hpc-train status`` as people read it: one line per run, one line per sweep. Each line is its name, its id,
its state, then a list of :class:`Part`\\ s — each a field of the ``--json`` data and how it reads — so that
another view of a run (GPU-hours, stragglers, a hung rank) is one more part, not another format string.

Accuracy is percent here (``top1=81.2%``), as the logs and ``report`` print it; ``--json`` keeps fractions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .rundir import COMPLETED, FINAL_STATES
from .sweeps import SweepStatus

PERCENT_KEYS = ("top1", "balanced", "many", "medium", "few")
"""Progress figures that are fractions in the data and percent in the line."""


@dataclass(frozen=True)
class Part:
    """One piece of a status line: the field it shows, and its text (None: nothing to show for this row)."""

    key: str
    text: Callable[[Mapping[str, Any]], str | None]


def _field(key: str, label: str | None = None) -> Part:
    shown = label or key.replace("_", " ")
    return Part(key, lambda row: f"{shown} {row[key]}" if row.get(key) not in (None, "") else None)


def _progress(row: Mapping[str, Any]) -> str | None:
    figures = row.get("progress") or {}
    return " ".join(f"{k}={100 * v:.1f}%" if k in PERCENT_KEYS and isinstance(v, (int, float)) else f"{k}={v}"
                    for k, v in figures.items()) or None


def _straggler(row: Mapping[str, Any]) -> str | None:
    s = row.get("straggler")
    return f"straggler rank {s['rank']} on {s['host']} ({s['ratio']:.1f}x the median compute time)" if s else None


def _excluded(row: Mapping[str, Any]) -> str | None:
    nodes = row.get("excluded_nodes")
    return f"excluded nodes {','.join(nodes)}" if nodes else None


RUN_PARTS: list[Part] = [
    _field("reason"), _field("slurm_state"), _field("elapsed"), _field("nodes"), _field("exit_code"),
    _field("restarts"), _field("first_failure"), _field("hint"), Part("progress", _progress),
    Part("straggler", _straggler), Part("excluded_nodes", _excluded),
]
"""What follows a run's name, job id and state, in this order."""


def _counts(sweep: Mapping[str, Any]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sweep["counts"].items())


def _listed(names: list[str], shown: int = 5) -> str:
    """The first ``shown`` names, and how many more there are."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _not_completed(sweep: Mapping[str, Any], shown: int = 5) -> str | None:
    names = [row["run"].rsplit("/", 1)[-1] + f" {row['state']}" for row in sweep["runs"]
             if row["run"] in sweep["not_completed"]]
    return "did not complete: " + _listed(names, shown) if names else None


def _point_names(rows: list[Mapping[str, Any]], shown: int = 5) -> str:
    return _listed([row["run"].rsplit("/", 1)[-1] for row in rows], shown)


def _ended(sweep: Mapping[str, Any]) -> bool:
    return all(row["state"] in FINAL_STATES or row["state"] == "unknown" for row in sweep["runs"])


def _completed(sweep: Mapping[str, Any]) -> str | None:
    """An ended sweep names its completed points too (the others are named by ``not_completed``): a sweep that
    finished is every point's outcome, not its first point's."""
    done = [row for row in sweep["runs"] if row["state"] == COMPLETED]
    return f"completed: {_point_names(done)}" if done and _ended(sweep) else None


def _arrays(sweep: Mapping[str, Any]) -> str | None:
    ids = sweep.get("array_job_ids") or []
    return f"{len(ids)} job arrays ({', '.join(ids)})" if len(ids) > 1 else None


SWEEP_PARTS: list[Part] = [Part("counts", _counts), Part("runs", _completed), Part("not_completed", _not_completed),
                           Part("array_job_ids", _arrays)]
"""What follows a sweep's name, job id and point count, in this order."""


def run_line(row: Mapping[str, Any]) -> str:
    extra = [text for part in RUN_PARTS if (text := part.text(row))]
    return f"{row['run']}  job {row['job_id']}  {row['state']}" + (f"  ({', '.join(extra)})" if extra else "")


def sweep_line(sweep: SweepStatus | Mapping[str, Any]) -> str:
    data = sweep.to_dict() if isinstance(sweep, SweepStatus) else sweep
    extra = [text for part in SWEEP_PARTS if (text := part.text(data))]
    return f"{data['sweep']}  job {data['job_id']}  {data['points']} point(s): " + "; ".join(extra)


def completed_message(run_name: str, rows: list[Mapping[str, Any]]) -> str:
    """``submit --wait`` that ended well: the run, or a sweep with every point it ran."""
    if len(rows) == 1:
        return f"{run_name} completed"
    return f"{run_name} completed: all {len(rows)} points ({_point_names(list(rows), shown=10)})"


def not_completed_message(sweep: SweepStatus) -> str:
    """``submit --wait`` of a sweep: every point that did not complete, and why (one line)."""
    missed = sweep.not_completed()
    why = [f"{row['run']} {row['state']}" + (f" ({row['reason']})" if row.get("reason") else "") for row in missed]
    return f"{sweep.name}: {len(missed)} of {len(sweep.runs)} point(s) did not complete: " + "; ".join(why)
