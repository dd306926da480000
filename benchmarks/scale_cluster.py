"""hpc-train on an emulated cluster of N nodes (issue 26, item 4): the test harness (tests/cluster) brought up with N
slurmd nodes on this one machine, one task per node, and hpc-train's submission lifecycle timed on it.

    # one size per hold of the machine's cluster lock (slurm-up is run here; slurm-down after it, by the caller)
    flock /work/locks/cluster.lock bash -c 'HPCTRAIN_SLURM_NODES=64 .venv/bin/python benchmarks/scale_cluster.py \\
        --out /tmp/scale-64.json; rc=$?; tests/cluster/slurm-down; tests/cluster/check-clean; exit $rc'
    .venv/bin/python benchmarks/scale_cluster.py --table /tmp/scale-16.json /tmp/scale-64.json   # BENCHMARKS.md's table

Per size N it measures (every figure one run, on a shared 2-core machine; BENCHMARKS.md says what that cannot show):

* ``up``: slurm-up's wall time, slurmd resident memory (sum and per node), slurmctld's;
* ``map``: ``hpc-train submit --nodes N --tasks-per-node 1 -- python benchmarks/scale_rank.py`` (torch-free: it
  records its mapping and calls ``hpc_train.dist.heartbeat``): the submit command, submit → every rank running,
  the mapping checked on every rank (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR,
  MASTER_PORT), the batch script's size, ``status`` of the job, the watchdog's probe step (the same ``srun
  --overlap`` one task per node the watchdog runs), the rendezvous block of the batch script (MASTER_ADDR and the
  master port), and ``cancel`` → every rank gone;
* ``sweep``: a held 1,000-point sweep (one node per point): submit, ``status`` of the sweep, its array script's
  size, ``cancel``;
* ``hang``: a job on N-1 nodes with ``hang_action: requeue``; one rank stops: the watchdog's requeue, and the run
  completing on nodes without the hung one (checked: ``restarts`` 1, ``excluded_nodes`` [that node], the second
  attempt's node list).

``--smoke`` runs the table code on a recorded result (tests/bench/test_scale_cluster.py runs it in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpc_train.hostlist import expand  # noqa: E402
from hpc_train.runs import liveness  # noqa: E402
from hpc_train.slurm import watchdog  # noqa: E402

RANK_SCRIPT = REPO / "benchmarks" / "scale_rank.py"
SLURM_UP = REPO / "tests" / "cluster" / "slurm-up"
SAMPLE = REPO / "benchmarks" / "scale_cluster_sample.json"
SWEEP_POINTS = 1000
HANG_TIMEOUT_S = 15
STATUS_REPEATS = 3
STRANDED_AFTER_S = 30  # a requeued job still held this long was left held (released within a second otherwise)


class BenchError(RuntimeError):
    """A step did not do what it must (the message says what was seen)."""


# --------------------------------------------------------------------------------------------------
# Running things
# --------------------------------------------------------------------------------------------------

@dataclass
class Cluster:
    """How to reach the running harness: the client commands' environment and the work directory."""

    env: dict[str, str]
    work: Path
    nodes: list[str]

    def hpc(self, *args: str, timeout_s: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
        """``hpc-train ARGS`` from the work directory; (result, wall seconds). A non-zero exit is an error."""
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "hpc_train.cli", *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise BenchError(f"hpc-train {' '.join(args)[:200]} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc, took

    def slurm(self, *argv: str, timeout_s: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
        start = time.perf_counter()
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        return proc, time.perf_counter() - start


def wait_until(what: str, done: Callable[[], Any], timeout_s: float, poll_s: float = 0.2) -> float:
    """Seconds until ``done()`` is true (polled every ``poll_s``)."""
    start = time.perf_counter()
    while not done():
        if time.perf_counter() - start > timeout_s:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return time.perf_counter() - start


def median_time(run: Callable[[], float], repeats: int = STATUS_REPEATS) -> dict[str, float]:
    times = [run() for _ in range(repeats)]
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
            "max_s": round(max(times), 3)}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------------------------------
# up: the harness with N nodes
# --------------------------------------------------------------------------------------------------

def bring_up(nodes: int) -> tuple[dict[str, Any], Cluster]:
    start = time.perf_counter()
    proc = subprocess.run([str(SLURM_UP)], env={**os.environ, "HPCTRAIN_SLURM_NODES": str(nodes)},
                          capture_output=True, text=True, timeout=600, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"slurm-up with {nodes} nodes exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    from tests.cluster import harness

    info = harness.read_cluster_info()
    if len(info.nodes) != nodes:
        raise BenchError(f"slurm-up brought up {len(info.nodes)} nodes, not {nodes}")
    run_dir = Path(info.state_dir) / "run"
    slurmd = [rss_kb(int(p.read_text().strip())) for p in sorted(run_dir.glob("slurmd-*.pid"))]
    phases = [line.split("] ", 1)[1][:60] for line in proc.stdout.splitlines() if line.startswith("[slurm-up")]
    up = {"slurm_up_s": round(took, 1), "slurmd_rss_total_mb": round(sum(slurmd) / 1024, 1),
          "slurmd_rss_per_node_mb": round(sum(slurmd) / 1024 / len(slurmd), 2),
          "slurmctld_rss_mb": round(rss_kb(int((run_dir / "slurmctld.pid").read_text().strip())) / 1024, 1),
          "phases": [re.sub(r"\s+", " ", p) for p in phases]}
    work = Path(tempfile.mkdtemp(prefix=f"scale-{nodes}-"))
    env = {**info.env, "PATH": f"{Path(sys.executable).parent}:{info.env.get('PATH', '')}",
           "HPC_TRAIN_STATE_DIR": str(work / ".state"), "PYTHONPATH": str(REPO)}
    env.pop("HPC_TRAIN_SITE", None)
    return up, Cluster(env=env, work=work, nodes=info.nodes)


# --------------------------------------------------------------------------------------------------
# map: submit → every rank running, the mapping, status, probe, rendezvous, cancel
# --------------------------------------------------------------------------------------------------

def rank_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in (run_dir / "scale").glob("rank-*.json"):
        try:
            found[int(path.stem.split("-")[1])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def wait_for_ranks(run_dir: Path, ranks: int, timeout_s: float = 240) -> float:
    """Seconds until every rank wrote its record; a launch that ended first is an error with srun's words."""
    def all_running() -> bool:
        if len(rank_records(run_dir)) >= ranks:
            return True
        try:
            ended = '"event": "exit"' in (run_dir / "state.jsonl").read_text()
        except OSError:
            ended = False
        if ended:
            raise BenchError(f"the launch ended before all {ranks} ranks ran ({len(rank_records(run_dir))} did): "
                             + "; ".join(srun_errors(run_dir)))
        return False

    return wait_until(f"all {ranks} ranks' records", all_running, timeout_s=timeout_s)


def srun_errors(run_dir: Path) -> list[str]:
    """srun's error lines in the ranks' logs, each kind once with its count (task numbers left out)."""
    counts: dict[str, int] = {}
    for log in run_dir.parent.glob(".submitit/*_log.err"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("srun: error:"):
                kind = re.sub(r"\b(task|gpu)\s*\d+", r"\1 N", line)
                counts[kind] = counts.get(kind, 0) + 1
    return [f"{n} x {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])[:4]]


def mapping_errors(records: dict[int, dict[str, Any]], nodes: int, restart: int = 0) -> list[str]:
    """What is wrong with the ranks' mapping (empty: right on every rank). One task per node: rank i runs on the
    i-th node of the job's node list, which is also MASTER_ADDR's source (its first node)."""
    errors = []
    if sorted(records) != list(range(nodes)):
        return [f"ranks {sorted(records)[:5]}... ({len(records)}) recorded, expected 0..{nodes - 1}"]
    allocated = expand(records[0]["SLURM_JOB_NODELIST"])
    ports = {r["MASTER_PORT"] for r in records.values()}
    if len(ports) != 1:
        errors.append(f"{len(ports)} different MASTER_PORTs: {sorted(ports)[:5]}")
    for rank, r in sorted(records.items()):
        want = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(nodes), "LOCAL_WORLD_SIZE": "1",
                "NODE_RANK": str(rank), "MASTER_ADDR": allocated[0], "SLURM_PROCID": str(rank),
                "HPC_TRAIN_RESTART": str(restart), "host": allocated[rank] if rank < len(allocated) else "?"}
        wrong = {k: (r.get(k), v) for k, v in want.items() if r.get(k) != v}
        if wrong:
            errors.append(f"rank {rank}: " + ", ".join(f"{k}={got!r} (expected {exp!r})" for k, (got, exp) in wrong.items()))
    return errors


def submit_command(cluster: Cluster, name: str, nodes: int, *extra: str) -> tuple[str, Path, float]:
    proc, took = cluster.hpc("submit", "--name", name, "--json", "--nodes", str(nodes), "--tasks-per-node", "1",
                             *extra, "--", sys.executable, str(RANK_SCRIPT))
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return str(data["job_id"]), Path(data["run_dir"]), took


def status_json(cluster: Cluster, what: str) -> tuple[dict[str, Any], float]:
    proc, took = cluster.hpc("status", what, "--json")
    return json.loads(proc.stdout), took


def probe_step(cluster: Cluster, job_id: str, run_dir: Path, nodes: int) -> dict[str, Any]:
    """The watchdog's diagnostic step, with the watchdog's own argv (hpc_train/slurm/watchdog.py: _probe_all)."""
    instance = f"slurm:{job_id}.0"
    watchdog.write_plan(run_dir, instance, liveness.read_beats(run_dir, instance))  # as the watchdog does first
    argv = ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={nodes}", "--ntasks-per-node=1", "--cpus-per-task=1",
            "--kill-on-bad-exit=0", "--wait=0", sys.executable, "-u", "-m", "hpc_train.slurm.watchdog", "probe",
            str(run_dir), instance]
    proc, took = cluster.slurm(*argv, timeout_s=300)
    answered = [p for p in (run_dir / "ranks").glob(f"probe-{instance.replace(':', '-')}-*.json")
                if not p.name.endswith("-plan.json")]
    return {"probe_step_s": round(took, 2), "probe_exit": proc.returncode, "probe_nodes_answered": len(answered)}


def rendezvous_block(script: str) -> str:
    """The batch script's rendezvous section (templates/partials/rendezvous.j2) as rendered."""
    start = script.index("# --- rendezvous")
    end = script.index('echo "hpc-train: MASTER_ADDR=', start)
    return script[start:script.index("\n", end) + 1]


def time_rendezvous(cluster: Cluster, script: str, job_id: str, nodelist: str, repeats: int = 3) -> dict[str, Any]:
    """The rendered rendezvous block run as the batch shell runs it, on this host (MASTER_ADDR from the node list,
    the master port bind-checked); its variables from the script's own preamble."""
    preamble = "\n".join(line for line in script.splitlines()
                         if line.startswith(("readonly HT_MASTER_PORT", "readonly HT_PYTHON")))
    program = f"set -eo pipefail\n{preamble}\nPYTHON=\"$HT_PYTHON\"\n{rendezvous_block(script)}"
    env = {**cluster.env, "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_ID": job_id}
    times, out = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", program], env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise BenchError(f"the rendezvous block exited {proc.returncode}: {proc.stderr[-500:]}")
        out = proc.stdout.strip()
    return {"rendezvous_s": round(statistics.median(times), 3), "rendezvous_said": out}


def measure_map(cluster: Cluster, nodes: int) -> dict[str, Any]:
    submitted_at = time.time()  # wall clock: the ranks' records carry theirs
    job_id, run_dir, submit_s = submit_command(cluster, "scale-map", nodes, "--set", "slurm.hang_timeout_s=600")
    wait_for_ranks(run_dir, nodes)
    records = rank_records(run_dir)
    first_s = min(r["time"] for r in records.values()) - submitted_at
    all_running_s = max(r["time"] for r in records.values()) - submitted_at
    errors = mapping_errors(records, nodes)
    script = (run_dir / "job.sbatch").read_text()
    status_times = median_time(lambda: status_json(cluster, job_id)[1])
    row, _ = status_json(cluster, job_id)
    result: dict[str, Any] = {
        "job_id": job_id, "submit_cli_s": round(submit_s, 2), "submit_to_first_rank_s": round(first_s, 2),
        "submit_to_all_ranks_s": round(all_running_s, 2), "mapping_ok_ranks": nodes - len(errors),
        "mapping_errors": errors[:5], "master_port": records[0]["MASTER_PORT"],
        "batch_script_bytes": len(script.encode()), "status_job": status_times, "status_state": row.get("state"),
        **probe_step(cluster, job_id, run_dir, nodes),
        **time_rendezvous(cluster, script, job_id, records[0]["SLURM_JOB_NODELIST"]),
    }
    pids = [r["pid"] for r in records.values()]
    _, cancel_s = cluster.hpc("cancel", job_id)
    gone_s = wait_until("every rank gone after cancel", lambda: not any(Path(f"/proc/{p}").exists() for p in pids),
                        timeout_s=120) + cancel_s
    left_s = wait_until("the job out of squeue", lambda: not cluster.slurm("squeue", "-h", "-j", job_id)[0].stdout.strip(),
                        timeout_s=120) + gone_s
    row, _ = status_json(cluster, job_id)
    result.update(cancel_cli_s=round(cancel_s, 2), cancel_to_ranks_gone_s=round(gone_s, 2),
                  cancel_to_out_of_queue_s=round(left_s, 2), state_after_cancel=row.get("state"))
    return result


# --------------------------------------------------------------------------------------------------
# sweep: a held 1,000-point sweep, status, cancel
# --------------------------------------------------------------------------------------------------

def measure_sweep(cluster: Cluster, points: int = SWEEP_POINTS) -> dict[str, Any]:
    seeds = "[" + ",".join(str(i) for i in range(points)) + "]"
    proc, submit_s = cluster.hpc("submit", "digits_lt_demo", "--name", "scale-sweep", "--json", "--tasks-per-node", "1",
                                 "--set", "train.device=cpu", "--sweep", f"train.seed={seeds}",
                                 "--set", "slurm.extra_sbatch={hold: true}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    sweep_id = str(data["job_id"])
    scripts = list((cluster.work / "runs" / "scale-sweep" / ".sweeps").glob("*/array-*.sbatch"))
    status_times = median_time(lambda: status_json(cluster, "scale-sweep")[1])
    row, _ = status_json(cluster, "scale-sweep")
    _, cancel_s = cluster.hpc("cancel", "scale-sweep")
    out_s = wait_until("the sweep out of squeue", lambda: not cluster.slurm("squeue", "-h", "-n", "scale-sweep")[0].stdout.strip(),
                       timeout_s=120) + cancel_s
    after, _ = status_json(cluster, "scale-sweep")
    return {"sweep_id": sweep_id, "points": points, "submit_cli_s": round(submit_s, 2), "arrays": len(scripts),
            "array_script_bytes": max((p.stat().st_size for p in scripts), default=0),
            "status_sweep": status_times, "counts": row.get("counts"), "cancel_cli_s": round(cancel_s, 2),
            "cancel_to_out_of_queue_s": round(out_s, 2), "counts_after_cancel": after.get("counts")}


# --------------------------------------------------------------------------------------------------
# hang: one rank stops; the watchdog requeues the job away from its node; the run completes
# --------------------------------------------------------------------------------------------------

def held_in_queue(cluster: Cluster, job_id: str) -> bool:
    """Slurm holds the job after a requeue that nobody released (``scontrol requeuehold`` without ``release``)."""
    reason = cluster.slurm("squeue", "-h", "-j", job_id, "-o", "%r")[0].stdout.strip()
    return reason == "job_requeued_in_held_state"


def watchdog_lines(run_dir: Path) -> list[str]:
    try:
        text = (run_dir / "logs" / "batch.log").read_text(errors="replace")
    except OSError:
        return []
    return [line[:240] for line in text.splitlines() if "watchdog" in line]


def launcher_nodes(run_dir: Path, restart: int) -> list[str]:
    events = [json.loads(line) for line in (run_dir / "state.jsonl").read_text().splitlines() if line.strip()]
    starts = [e for e in events if e.get("event") == "running" and e.get("writer") == "launcher"
              and e.get("restart") == restart]
    return expand(starts[-1]["nodes"]) if starts else []


def measure_hang(cluster: Cluster, nodes: int) -> dict[str, Any]:
    ranks = nodes - 1  # the requeued attempt must fit on the nodes left once the hung one is excluded
    job_id, run_dir, _ = submit_command(cluster, "scale-hang", ranks, "--set", f"slurm.hang_timeout_s={HANG_TIMEOUT_S}",
                                        "--set", "slurm.hang_action=requeue")
    wait_for_ranks(run_dir, ranks)
    wait_until("every rank's heartbeat", lambda: len(list((run_dir / "ranks").glob("rank-*.progress"))) >= ranks,
               timeout_s=120)
    hung = ranks - 1
    bad = rank_records(run_dir)[hung]["host"]
    (run_dir / "scale" / "hang").write_text(str(hung))
    hung_at = time.perf_counter()
    states: list[tuple[float, str]] = []
    held_since: float | None = None
    while True:
        row, _ = status_json(cluster, job_id)
        since = time.perf_counter() - hung_at
        if not states or states[-1][1] != row["state"]:
            states.append((round(since, 1), row["state"]))
        if row["state"] not in ("running", "queued", "requeued"):
            break
        if not held_in_queue(cluster, job_id):
            held_since = None
        elif held_since is None:
            held_since = since
        if held_since is not None and since - held_since > STRANDED_AFTER_S:
            states.append((round(since, 1), f"stranded: held for {since - held_since:.0f} s ({row.get('reason', '')})"))
            break
        if since > HANG_TIMEOUT_S + 240:
            raise BenchError(f"the hung run did not end within {since:.0f} s: {states}")
        time.sleep(0.5)
    second = launcher_nodes(run_dir, 1)
    shown = cluster.slurm("scontrol", "show", "job", job_id)[0].stdout
    slurm_said = [w for w in shown.split() if w.startswith(("JobState=", "Reason=", "Restarts=", "ExcNodeList="))]
    if held_in_queue(cluster, job_id):  # hpc-train left it held (issue 26's requeue race): not ours to keep queued
        cluster.slurm("scancel", job_id)
    checks = {"completed": row["state"] == "completed", "restarts_1": row.get("restarts") == 1,
              "excluded_is_hung_node": row.get("excluded_nodes") == [bad],
              "second_attempt_avoids_it": bool(second) and bad not in second,
              "exc_node_list": f"ExcNodeList={bad}" in shown,
              "mapping_after_requeue": not mapping_errors(rank_records(run_dir), ranks, restart=1)}
    requeued = next((t for t, s in states if s == "requeued"), None)
    return {"job_id": job_id, "ranks": ranks, "hang_timeout_s": HANG_TIMEOUT_S, "hung_node": bad,
            "hang_to_requeued_s": requeued, "hang_to_completed_s": states[-1][0], "states": states,
            "checks": checks, "slurm_said": slurm_said, "watchdog_log": watchdog_lines(run_dir)}


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

COLUMNS: list[tuple[str, str, Callable[[dict[str, Any]], str]]] = [  # (row title, part, cell of that part)
    ("slurm-up, s", "up", lambda u: f"{u['slurm_up_s']:.0f}"),
    ("slurmd RSS per node / all, MB", "up", lambda u: f"{u['slurmd_rss_per_node_mb']:.1f} / {u['slurmd_rss_total_mb']:.0f}"),
    ("submit → all ranks running, s", "map", lambda m: f"{m['submit_to_all_ranks_s']:.1f}"),
    ("mapping right on", "map", lambda m: f"{m['mapping_ok_ranks']} ranks" + (" (errors: see JSON)" if m["mapping_errors"] else "")),
    ("batch script, bytes", "map", lambda m: f"{m['batch_script_bytes']:,}"),
    ("rendezvous block (MASTER_ADDR, port), s", "map", lambda m: f"{m['rendezvous_s']:.3f}"),
    ("watchdog probe step, s", "map", lambda m: f"{m['probe_step_s']:.1f} ({m['probe_nodes_answered']} nodes answered)"),
    ("`status` of the job, s", "map", lambda m: f"{m['status_job']['median_s']:.2f}"),
    ("`cancel` → ranks gone / out of queue, s", "map", lambda m: f"{m['cancel_to_ranks_gone_s']:.1f} / {m['cancel_to_out_of_queue_s']:.1f}"),
    ("1,000-point held sweep: submit / `status` / `cancel`, s", "sweep", lambda w: f"{w['submit_cli_s']:.1f} / "
     f"{w['status_sweep']['median_s']:.2f} / {w['cancel_cli_s']:.1f}"),
    ("hang → requeued / completed, s", "hang", lambda h: hang_cell(h)),
    ("requeue checks", "hang", lambda h: "all pass" if all(h["checks"].values())
     else "FAILED: " + ", ".join(k for k, v in h["checks"].items() if not v)),
]


def cell(result: dict[str, Any], part: str, show: Callable[[dict[str, Any]], str]) -> str:
    measured = result.get(part)
    if not measured:
        return "not measured"
    if "error" in measured:
        return "error: " + measured["error"].splitlines()[0][:90]
    return show(measured)


def hang_cell(hang: dict[str, Any]) -> str:
    last = hang["states"][-1][1]
    end = f"{hang['hang_to_completed_s']}" if last == "completed" else f"{last.split(' (')[0]} at {hang['states'][-1][0]}"
    return f"{hang['hang_to_requeued_s']} / {end}"


def table(results: list[dict[str, Any]]) -> str:
    """One column per size, one row per measurement (BENCHMARKS.md)."""
    results = sorted(results, key=lambda r: r["nodes"])
    lines = ["| measure | " + " | ".join(f"{r['nodes']} nodes" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for title, part, show in COLUMNS:
        lines.append(f"| {title} | " + " | ".join(cell(r, part, show) for r in results) + " |")
    return "\n".join(lines)


def run(nodes: int, parts: list[str], out: Path | None) -> dict[str, Any]:
    """Every part in turn; the result so far is written to ``out`` after each (a run cut short keeps its figures)."""
    result: dict[str, Any] = {"nodes": nodes, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "load_start": os.getloadavg()[0]}
    started = time.perf_counter()
    result["up"], cluster = bring_up(nodes)
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    steps = {"map": lambda: measure_map(cluster, nodes), "sweep": lambda: measure_sweep(cluster),
             "hang": lambda: measure_hang(cluster, nodes)}
    for part in parts:
        try:
            result[part] = steps[part]()
        except (BenchError, subprocess.TimeoutExpired) as exc:
            result[part] = {"error": str(exc)[-2000:]}
        print(f"[scale {nodes}] {part}: {json.dumps(result[part])[:400]}", flush=True)
        if out:
            out.write_text(json.dumps(result, indent=2) + "\n")
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["load_end"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("HPCTRAIN_SLURM_NODES") or 16))
    parser.add_argument("--parts", default="map,sweep,hang", help="comma-separated: map, sweep, hang")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    parser.add_argument("--table", nargs="+", type=Path, metavar="RESULT", help="print the table of these results")
    parser.add_argument("--smoke", action="store_true", help=f"print the table of the recorded {SAMPLE.name}")
    args = parser.parse_args(argv)
    if args.smoke or args.table:
        files = [SAMPLE] if args.smoke else args.table
        results = [r for f in files for r in (lambda d: d if isinstance(d, list) else [d])(json.loads(f.read_text()))]
        print(table(results))
        return 0
    if os.geteuid() != 0:
        print("scale_cluster: the test harness needs root (tests/cluster/slurm-up)", file=sys.stderr)
        return 2
    parts = [p for p in args.parts.split(",") if p]
    result = run(args.nodes, parts, args.out)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    print(table([result]))
    return 0 if all("error" not in result.get(p, {}) for p in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
