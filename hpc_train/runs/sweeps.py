"""Sweeps as users see them: the points of one submission — a Slurm job array's runs ``<array id>_<point>``, a
local sweep's ``local-<time>-<pid>_<point>`` — found by any name a user gives (the job name, ``NAME/<id>_*`` as
``submit`` prints it, the array id), in sweep order, and summed up per state.

The run directory's name says which sweep a run belongs to and which point it is, for runs of every version;
The order ``report`` and ``status`` list runs in (points by number, not as text: ``_10`` after ``_9``) is
:func:`~.index.order_key`, beside the listing that sorts by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import rundir
from .index import Run, of_one_job, all_runs, check_selector, resolve_run

_POINT = re.compile(r"(?P<prefix>.+)_(?P<point>\d+)\Z")


def point_of(run: Run) -> tuple[str, int] | None:
    """(the sweep's id within its job's directory, the point's number) of a sweep point; None for a single run."""
    m = _POINT.match(run.run_dir.name)
    return (m.group("prefix"), int(m.group("point"))) if m else None


def sweep_name(run: Run) -> str | None:
    """``NAME/<id>_*``: the sweep's name, as ``submit`` prints it."""
    found = point_of(run)
    return f"{run.run_dir.parent.name}/{found[0]}_*" if found else None


def points(of: Run, runs: Sequence[Run]) -> list[Run]:
    """Every point of ``of``'s sweep among ``runs``, in sweep order (``[of]`` for a single run)."""
    found = point_of(of)
    if found is None:
        return [of]
    same = [r for r in runs if r.run_dir.parent == of.run_dir.parent and (point_of(r) or ("",))[0] == found[0]]
    return sorted(same, key=lambda r: (point_of(r) or ("", 0))[1])


def find(ref: str, root: Any) -> tuple[list[Run], bool]:
    """What ``status REF`` shows, and whether it is a sweep: a sweep's points (``NAME``, whose latest run is a
    point; ``NAME/<id>_*``; an array id ``<id>`` or ``NAME/<id>``), or the one run ``REF`` names
    (``NAME/<id>_<k>`` is one point)."""
    check_selector(ref)
    runs = all_runs(root)
    name, _, ident = ref.rpartition("/")
    prefix = ident[:-2] if ident.endswith("_*") else ident
    swept = [r for r in runs if prefix and (found := point_of(r)) is not None and found[0] == prefix
             and (not name or r.run_dir.parent.name == name)]
    exact = [r for r in runs if r.name == ref or r.run_dir.name == ref]
    if swept and not exact:
        return points(of_one_job(ref, swept)[-1], runs), True
    run = resolve_run(ref, root)
    if ref == run.run_dir.parent.name and point_of(run):  # a job name: its latest submission, a whole sweep
        return points(run, runs), True
    return [run], False


SWEEP_FIELDS = ("sweep", "job_id", "points", "counts", "not_completed", "array_job_ids", "runs")
"""The fields of ``status --json`` for a sweep (``array_job_ids``: its job arrays, several where the sweep was
larger than the cluster's MaxArraySize; ``runs``: each point's status)."""


@dataclass(frozen=True)
class SweepStatus:
    """One sweep, from its points' statuses (:func:`hpc_train.runs.status.run_status`)."""

    name: str
    job_id: str
    runs: tuple[Mapping[str, Any], ...]
    array_job_ids: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        """Points per state, in the states' order (unknown last)."""
        found: dict[str, int] = {}
        for row in self.runs:
            found[row["state"]] = found.get(row["state"], 0) + 1
        order = {state: i for i, state in enumerate(rundir.STATES)}
        return {k: found[k] for k in sorted(found, key=lambda k: order.get(k, len(order)))}

    def not_completed(self) -> list[Mapping[str, Any]]:
        """The points that ended without completing (failed, cancelled, preempted, unknown)."""
        return [r for r in self.runs if r["state"] != rundir.COMPLETED and (r["state"] in rundir.FINAL_STATES
                                                                           or r["state"] == "unknown")]

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": self.name, "job_id": self.job_id, "points": len(self.runs), "counts": self.counts(),
                "not_completed": [r["run"] for r in self.not_completed()],
                "array_job_ids": list(self.array_job_ids or [self.job_id]), "runs": list(self.runs)}


def array_ids(run: Run) -> list[str]:
    """The job arrays of ``run``'s sweep (one, or several where it was split at the cluster's MaxArraySize)."""
    ids = run.record.get("array_job_ids") or [run.record.get("array_job_id")]
    return [str(i) for i in ids if i]


def sweep_status(run: Run, rows: Sequence[Mapping[str, Any]]) -> SweepStatus:
    found = point_of(run)
    job_id = str(run.record.get("sweep_id") or run.record.get("array_job_id") or (found[0] if found else run.job_id))
    return SweepStatus(sweep_name(run) or run.name, job_id, tuple(rows), tuple(array_ids(run)))
