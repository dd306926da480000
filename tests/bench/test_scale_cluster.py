"""benchmarks/scale_cluster.py does not rot: the parts that need no cluster run here (its table from the recorded
results, the mapping check, the rendered rendezvous block run as the batch shell runs it). The benchmark itself is
run by hand on the harness (BENCHMARKS.md, "hpc-train on 16 to 256 emulated nodes")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import scale_cluster

REPO = Path(__file__).resolve().parents[2]


def test_the_smoke_mode_prints_the_recorded_table():
    proc = subprocess.run([sys.executable, "benchmarks/scale_cluster.py", "--smoke"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(scale_cluster.SAMPLE.read_text())
    header = proc.stdout.splitlines()[0]
    assert all(f"{r['nodes']} nodes" in header for r in recorded), header
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines()[2:]}
    assert set(rows) == {title for title, _, _ in scale_cluster.COLUMNS}
    assert all(f"| {r['nodes']} ranks" in rows["mapping right on"] for r in recorded), rows["mapping right on"]


def _records(nodes: list[str]) -> dict[int, dict]:
    nodelist = "gpu[" + ",".join(n[3:] for n in nodes) + "]"
    return {r: {"RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(nodes)), "LOCAL_WORLD_SIZE": "1",
                "NODE_RANK": str(r), "MASTER_ADDR": nodes[0], "MASTER_PORT": "20004", "SLURM_PROCID": str(r),
                "HPC_TRAIN_RESTART": "0", "SLURM_JOB_NODELIST": nodelist, "host": nodes[r]} for r in range(len(nodes))}


def test_the_mapping_check_accepts_the_right_mapping_and_names_each_wrong_rank():
    nodes = ["gpu98", "gpu99", "gpu100", "gpu101"]
    assert scale_cluster.mapping_errors(_records(nodes), 4) == []
    wrong = _records(nodes)
    wrong[2]["host"] = "gpu99"  # two ranks on one node
    wrong[3]["MASTER_ADDR"] = "gpu101"
    errors = scale_cluster.mapping_errors(wrong, 4)
    assert len(errors) == 2 and errors[0].startswith("rank 2: host='gpu99'") and "MASTER_ADDR='gpu101'" in errors[1]
    missing = _records(nodes)
    del missing[1]
    assert "expected 0..3" in scale_cluster.mapping_errors(missing, 4)[0]


def test_the_rendered_rendezvous_block_runs_and_names_the_first_node(tmp_path):
    render = subprocess.run([sys.executable, "-m", "hpc_train.cli", "render", "--nodes", "3", "--tasks-per-node", "1",
                             "--", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    block = scale_cluster.rendezvous_block(render.stdout)
    assert block.startswith("# --- rendezvous") and block.rstrip().endswith('MASTER_PORT=$MASTER_PORT"')
    cluster = scale_cluster.Cluster(env={"PATH": "/usr/bin:/bin"}, work=tmp_path, nodes=[])
    timed = scale_cluster.time_rendezvous(cluster, render.stdout, "77", "gpu[100-102]", repeats=1)
    assert timed["rendezvous_said"].startswith("hpc-train: MASTER_ADDR=gpu100 MASTER_PORT=")
