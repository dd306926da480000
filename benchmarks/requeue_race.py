"""Count the watchdog requeues that strand their job (issue 26): N runs of hang -> watchdog requeue -> completed on
the running test cluster, PARALLEL at a time, each followed to its end (tests/real_cluster/requeue_race.py).

The cluster is whatever ``tests/cluster/slurm-up`` brought up (``cluster.json`` and ``etc/slurm.conf`` in the
harness's state directory, ``HPCTRAIN_SLURM_DIR`` or ``.slurm/``); the Slurm version is asked of ``sinfo``, so the
same command counts on any version the harness runs. Take the machine's cluster lock for it::

    flock /work/locks/cluster.lock bash -c 'tests/cluster/slurm-up && \\
        .venv/bin/python -m benchmarks.requeue_race --runs 10 --parallel 5 --out /tmp/race.jsonl; \\
        rc=$?; tests/cluster/slurm-down; tests/cluster/check-clean; exit $rc'

Exit 1 when any run was stranded (left held) or did not complete; one JSON line per run in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster import harness
from tests.real_cluster.requeue_race import RaceRun, follow, submit


def slurm_version(env: dict[str, str]) -> str:
    return subprocess.run(["sinfo", "--version"], capture_output=True, text=True, env=env).stdout.strip()


def one(env: dict[str, str], work: Path, index: int, hang_timeout_s: int, version: str, out: Path | None) -> RaceRun:
    """One run, its JSON line printed (and appended to ``out``) as soon as it ended."""
    try:
        run = follow(env, work, submit(env, work, f"race{index}", hang_timeout_s=hang_timeout_s))
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:  # counted, not fatal to the rest
        run = RaceRun("", work, end=f"error: {str(exc).strip().splitlines()[-1][:200]}")
    line = json.dumps({"slurm": version, **run.summary()})
    print(line, flush=True)
    if out:
        with out.open("a") as handle:
            handle.write(line + "\n")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=4, help="runs at a time (each takes 2 CPUs of one node)")
    parser.add_argument("--hang-timeout-s", type=int, default=10)
    parser.add_argument("--out", type=Path, help="append one JSON line per run here")
    args = parser.parse_args(argv)
    env = harness.read_cluster_info().env
    version = slurm_version(env)
    work = Path(tempfile.mkdtemp(prefix="requeue-race-"))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        runs = list(pool.map(lambda i: one(env, work, i, args.hang_timeout_s, version, args.out), range(args.runs)))
    stranded = [r for r in runs if r.stranded]
    unexcluded = [r for r in runs if not r.excluded]
    unfinished = [r for r in runs if r.end != "COMPLETED"]
    print(f"{version}: {len(runs)} runs in {time.monotonic() - started:.0f} s: {len(stranded)} stranded (left held), "
          f"{len(unexcluded)} without the node in ExcNodeList, {len(unfinished)} not COMPLETED")
    return 1 if stranded or unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
