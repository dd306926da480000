"""A torch-free command under hpc-train's heartbeat (docs/commands.md), for the lifecycle tests on every Slurm
version: ``beat.py STEPS [RESUMED_STEP_S]`` counts STEPS steps of 0.1 s (RESUMED_STEP_S each on a restart, 0.1 s
unless given: a test that hangs the first attempt need not wait out the second at the first one's pace), calls
``heartbeat`` on each, keeps its step in a per-rank checkpoint (so a restart resumes), prints one line per rank at
the start and writes done-RANK.json at the end."""

import json
import os
import socket
import sys
import time

from hpc_train.dist import heartbeat

rank = os.environ["RANK"]
restart = int(os.environ["HPC_TRAIN_RESTART"])
checkpoint = os.path.join(os.environ["HPC_TRAIN_CHECKPOINT_DIR"], f"rank-{rank}.json")
step = json.load(open(checkpoint))["step"] if os.path.exists(checkpoint) else 0
resumed_from = step
step_s = float(sys.argv[2]) if restart > 0 and len(sys.argv) > 2 else 0.1
print(f"rank {rank} on {socket.gethostname()}: restart {restart}, from step {step}", flush=True)
while step < int(sys.argv[1]):
    time.sleep(step_s)
    step += 1
    heartbeat(step=step)
    with open(checkpoint + ".tmp", "w") as handle:
        json.dump({"step": step}, handle)
    os.replace(checkpoint + ".tmp", checkpoint)
with open(os.path.join(os.environ["HPC_TRAIN_RUN_DIR"], f"done-{rank}.json"), "w") as handle:
    json.dump({"step": step, "resumed_from": resumed_from, "restart": restart, "host": socket.gethostname()}, handle)
