"""One watchdog requeue on the harness, followed to its end (issue 26): a 1-node job of two ranks that heartbeat
and then hang (tests/scripts/beat_then_hang.py) with ``hang_action: requeue``; the watchdog requeues it away from
its node and the next attempt completes. What counts is whether the job was ever left held (stranded: Slurm's
``job_requeued_in_held_state`` for longer than any requeue takes) and whether its ExcNodeList got the node.

Shared by tests/real_cluster/test_requeue_race.py (one run, in CI) and benchmarks/requeue_race.py (N runs, to
count strandings). Everything is taken from the running harness (``cluster.json``, ``SLURM_CONF``), nothing from
a Slurm version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpc_train.slurm import requeue

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "beat_then_hang.py"
STRANDED_AFTER_S = 20.0
"""Held this long without a break: stranded (the watchdog's hold lasts well under a second when it works)."""
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@dataclass
class RaceRun:
    job_id: str
    run_dir: Path
    end: str = ""
    """The job's last state, or ``stranded`` (left held), or ``timeout`` (still running when we stopped)."""
    held_s: float = 0.0
    """The longest uninterrupted time the job was held."""
    exc_node_list: str = ""
    first_node: str = ""
    nodes: list[str] = field(default_factory=list)
    restarts: int = 0
    watchdog_lines: list[str] = field(default_factory=list)
    held_status: str = ""
    """hpc-train status while the job was held (for the report)."""
    took_s: float = 0.0

    @property
    def stranded(self) -> bool:
        return self.end == "stranded"

    @property
    def excluded(self) -> bool:
        return bool(self.first_node) and self.first_node in self.exc_node_list.split(",")

    def summary(self) -> dict:
        return {"job": self.job_id, "end": self.end, "held_s": round(self.held_s, 1), "exc": self.exc_node_list,
                "first_node": self.first_node, "nodes": self.nodes, "restarts": self.restarts,
                "took_s": round(self.took_s, 1), "watchdog": self.watchdog_lines[-3:], "held_status": self.held_status}


def _cluster():
    """The running harness: its ``python`` runs hpc-train where that Slurm version's jobs run (the host's venv on
    22.05, a chroot's on 24.11 / 26.05), ``job_python`` is that interpreter as a job sees it."""
    from tests.cluster import harness

    return harness.read_cluster_info()


def hpc_env(env: dict[str, str], work: Path) -> dict[str, str]:
    (work / ".state").mkdir(exist_ok=True)  # the run index of these runs (hpc-train does not create its folder)
    out = {**env, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', os.environ['PATH'])}",
           "HPC_TRAIN_STATE_DIR": str(work / ".state"),
           "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])}
    out.pop("HPC_TRAIN_SITE", None)
    return out


def hpc(env: dict[str, str], work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([_cluster().python, "-m", "hpc_train.cli", *args], capture_output=True, text=True, cwd=work,
                            env=hpc_env(env, work), timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"hpc-train {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def submit(env: dict[str, str], work: Path, name: str, hang_timeout_s: int = 10, beat_s: float = 3.0) -> RaceRun:
    out = hpc(env, work, "submit", "--name", name, "--json", "--nodes", "1", "--tasks-per-node", "2",
              "--set", f"slurm.hang_timeout_s={hang_timeout_s}", "--set", "slurm.hang_action=requeue",
              "--", _cluster().job_python, str(SCRIPT), str(beat_s))
    data = json.loads(out.stdout.splitlines()[-1])
    return RaceRun(str(data["job_id"]), Path(data["run_dir"]))


def show_job(env: dict[str, str], job_id: str) -> dict[str, str]:
    result = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, env=env,
                            timeout=30)
    return requeue.job_fields(result.stdout) if result.returncode == 0 else {}


def follow(env: dict[str, str], work: Path, run: RaceRun, timeout_s: float = 240.0) -> RaceRun:
    """Poll ``scontrol show job`` until the job ended, was held for :data:`STRANDED_AFTER_S`, or ``timeout_s``
    passed; a stranded job is cancelled after its facts are taken."""
    start = time.monotonic()
    held_since: float | None = None
    fields: dict[str, str] = {}
    while time.monotonic() - start < timeout_s:
        fields = show_job(env, run.job_id) or fields
        if not run.first_node and fields.get("JobState") == "RUNNING":
            run.first_node = fields.get("NodeList", "")
        held = fields.get("JobState") == "PENDING" and fields.get("Reason") in requeue.HELD_REASONS
        now = time.monotonic()
        held_since = (held_since or now) if held else None
        run.held_s = max(run.held_s, now - held_since if held_since else 0.0)
        if held and not run.held_status and now - (held_since or now) > 3:
            run.held_status = hpc(env, work, "status", run.job_id, check=False).stdout.strip()
        if run.held_s >= STRANDED_AFTER_S:
            run.end = "stranded"
            break
        if fields.get("JobState") in ENDED:
            run.end = fields["JobState"]
            break
        time.sleep(0.5)
    else:
        run.end = "timeout"
    run.took_s = time.monotonic() - start
    run.exc_node_list = fields.get("ExcNodeList", "(null)")
    run.restarts = int(fields.get("Restarts", "0") or 0)
    run.nodes = _attempt_nodes(run.run_dir)
    run.first_node = run.first_node or (run.nodes[0] if run.nodes else "")  # ran before it was looked at
    run.watchdog_lines = _watchdog_lines(run.run_dir)
    if run.end in ("stranded", "timeout"):
        subprocess.run(["scancel", run.job_id], env=env, capture_output=True, timeout=30)
    return run


def _attempt_nodes(run_dir: Path) -> list[str]:
    """The node list of each attempt, from the launcher's ``running`` lines."""
    try:
        events = [json.loads(line) for line in (run_dir / "state.jsonl").read_text().splitlines() if line.strip()]
    except OSError:
        return []
    return [str(e.get("nodes", "")) for e in events if e.get("event") == "running" and e.get("writer") == "launcher"]


def _watchdog_lines(run_dir: Path) -> list[str]:
    try:
        text = (run_dir / "logs" / "batch.log").read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if "watchdog:" in line and not line.startswith(" ")]
