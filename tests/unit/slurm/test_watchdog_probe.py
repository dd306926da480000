"""The watchdog's diagnostic step scales with the node count: each node's probe task reads the watchdog's plan (its
node's ranks and pids), not every rank's heartbeat — N tasks x N heartbeats was 65,536 reads of the shared run
directory at 256 nodes (benchmarks/scale_cluster.py). The probe runs here as a task of that step runs it, on a run
directory of 200 ranks on 200 nodes; only the host name is given (the task asks the kernel for its node's)."""

from __future__ import annotations

import json
import pathlib
import subprocess

from hpc_train.runs import liveness, rundir
from hpc_train.slurm import watchdog

INSTANCE = "slurm:41.0"


def _gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _run_dir_of_200_ranks(run_dir: pathlib.Path, pid: int) -> None:
    (run_dir / rundir.RANKS_DIR).mkdir()
    for rank in range(200):
        rundir.write_json_atomic(run_dir / liveness.PROGRESS_FILE.format(rank=rank), {
            "rank": rank, "host": f"gpu{rank + 1:03d}", "pid": pid if rank == 6 else 10**6 + rank,
            "instance": INSTANCE, "beat": 3, "step": 3, "phase": "train", "time": 1.0})


def test_a_probe_task_reads_the_plan_not_every_heartbeat(tmp_path, monkeypatch):
    pid = _gone_pid()
    _run_dir_of_200_ranks(tmp_path, pid)
    watchdog.write_plan(tmp_path, INSTANCE, liveness.read_beats(tmp_path, INSTANCE))
    reads: list[str] = []
    real_read_text = pathlib.Path.read_text

    def counted(self, *args, **kwargs):
        reads.append(self.name)
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", counted)
    monkeypatch.setattr(watchdog.socket, "gethostname", lambda: "gpu007")
    monkeypatch.setattr(liveness, "DUMP_WAIT_S", 0.0)
    assert watchdog.probe(tmp_path, INSTANCE) == 0
    answer = json.loads(real_read_text(tmp_path / "ranks" / "probe-slurm-41.0-gpu007.json"))
    assert [(a["rank"], a["host"], a["pid"], a["state"]) for a in answer] == [(6, "gpu007", pid, "gone")]
    assert [name for name in reads if name.endswith(".progress")] == [], f"{len(reads)} files read"


def test_a_probe_without_a_plan_says_so_and_fails(tmp_path, monkeypatch, capsys):
    _run_dir_of_200_ranks(tmp_path, _gone_pid())
    monkeypatch.setattr(watchdog.socket, "gethostname", lambda: "gpu007")
    assert watchdog.probe(tmp_path, INSTANCE) == 1
    assert "no readable plan" in capsys.readouterr().err
    assert not (tmp_path / "ranks" / "probe-slurm-41.0-gpu007.json").exists()
