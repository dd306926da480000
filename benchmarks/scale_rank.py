"""One rank of the scale benchmark's job (benchmarks/scale_cluster.py): ``hpc-train submit ... -- python
benchmarks/scale_rank.py``. Torch-free: the trainer at 64-256 ranks needs more memory than one machine has, so this
stands in for it with what the launch contract gives every rank (docs/commands.md).

It writes what its environment says (``scale/rank-<RANK>.json`` in ``$HPC_TRAIN_RUN_DIR``: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT, its host), then calls
``hpc_train.dist.heartbeat`` every 0.2 s, which arms the batch script's watchdog. It ends:

* on the first start (``HPC_TRAIN_RESTART`` 0), never by itself: the benchmark cancels it, or writes
  ``scale/hang`` holding a rank number. That rank then stops beating and stops itself (SIGSTOP, as a rank stuck in
  a driver would look to the probe); every other rank beats one more second and then waits without beating, as
  ranks blocked in a collective behind it do; the watchdog is what ends the attempt;
* on a requeued start, after ``--done-after-s`` seconds of beating (exit 0: the run completes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from hpc_train.dist import heartbeat

BEAT_EVERY_S = 0.2
MAPPING_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                "SLURM_PROCID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "HPC_TRAIN_RESTART")


def record(scale_dir: Path, rank: int) -> None:
    """What this rank was told, written atomically (the benchmark reads every rank's file while others write)."""
    data = {key: os.environ.get(key) for key in MAPPING_KEYS}
    data.update(host=socket.gethostname(), pid=os.getpid(), time=time.time())
    tmp = scale_dir / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(scale_dir / f"rank-{rank}.json")


def hung_rank(scale_dir: Path) -> int | None:
    try:
        return int((scale_dir / "hang").read_text())
    except (OSError, ValueError):
        return None


def first_start(scale_dir: Path, rank: int) -> None:
    step = 0
    while (hang := hung_rank(scale_dir)) is None:
        heartbeat(step=step)
        step += 1
        time.sleep(BEAT_EVERY_S)
    if rank == hang:
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            heartbeat(step=step)
            step += 1
            time.sleep(BEAT_EVERY_S)
    while True:  # blocked behind the hung rank, as in a collective: no more progress
        time.sleep(60)


def requeued_start(done_after_s: float) -> int:
    step, until = 0, time.monotonic() + done_after_s
    while time.monotonic() < until:
        heartbeat(step=step)
        step += 1
        time.sleep(BEAT_EVERY_S)
    heartbeat(step=step, phase="done")
    return 0


def main(argv: list[str]) -> int:
    done_after_s = float(argv[argv.index("--done-after-s") + 1]) if "--done-after-s" in argv else 3.0
    rank = int(os.environ["RANK"])
    scale_dir = Path(os.environ["HPC_TRAIN_RUN_DIR"]) / "scale"
    scale_dir.mkdir(exist_ok=True)
    record(scale_dir, rank)
    if int(os.environ.get("HPC_TRAIN_RESTART") or 0) > 0:
        return requeued_start(done_after_s)
    first_start(scale_dir, rank)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
