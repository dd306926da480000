"""A rank that heartbeats (hpc_train.dist.heartbeat) for BEAT_S seconds and then, on the job's first attempt only,
sleeps without a heartbeat until the watchdog ends it; on a later attempt it beats and exits 0. Torch-free: the
watchdog's hang -> requeue path without a trainer (tests/real_cluster/test_requeue_race.py, benchmarks/requeue_race.py)."""

import os
import sys
import time

from hpc_train.dist import heartbeat

beat_s = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
step, until = 0, time.monotonic() + beat_s
while time.monotonic() < until:
    step += 1
    heartbeat(step)
    time.sleep(0.2)
if int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0:
    time.sleep(3600)  # hung: no heartbeat from here on
