"""A run's bad-node list, ``excluded_nodes.json`` in its run directory (so it survives requeues): the nodes a hang
or a node failure of this run was traced to, which its next attempts avoid. The batch script's watchdog
(:mod:`hpc_train.slurm.watchdog`) adds to it and hands it to Slurm; ``status`` shows it. Torch-free, stdlib only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from . import rundir, safe_files

EXCLUDED_NODES = "excluded_nodes.json"


def excluded(run_dir: Path) -> list[dict[str, Any]]:
    """The run's excluded nodes, oldest first: ``{"node", "reason", "job_id", "restart", "time"}`` each."""
    try:
        data = safe_files.read_json(run_dir / EXCLUDED_NODES)
    except (OSError, ValueError, safe_files.RunFileError):
        return []
    return [e for e in data.get("nodes", []) if isinstance(e, dict) and e.get("node")] if isinstance(data, dict) else []


def excluded_names(run_dir: Path) -> list[str]:
    return list(dict.fromkeys(str(e["node"]) for e in excluded(run_dir)))


def add(run_dir: Path, node: str, reason: str, *, job_id: str | None, restart: int, pool: Sequence[str] = (),
        pool_name: str = "the partition", needed_nodes: int = 1) -> tuple[bool, str]:
    """Add ``node`` to the list, unless that would leave ``pool`` (the nodes the job may run on, called
    ``pool_name``; empty: not known) fewer than ``needed_nodes`` (the job would pend forever). Returns (whether the
    node is listed now, what to say: empty when it was listed already)."""
    names = excluded_names(run_dir)
    if node in names:
        return True, ""
    if pool and len([n for n in pool if n not in names and n != node]) < needed_nodes:
        return False, (f"not excluding {node}: only {len(pool) - len(names) - 1} node(s) of {pool_name} would remain "
                       f"for a job of {needed_nodes} node(s)")
    entries = excluded(run_dir) + [{"node": node, "reason": reason, "job_id": job_id, "restart": restart,
                                    "time": rundir.now()}]
    rundir.write_json_atomic(run_dir / EXCLUDED_NODES, {"nodes": entries})
    return True, f"excluded node {node} from this job's next attempts ({reason})"
