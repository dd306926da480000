"""A user's own program under hpc-train's preemption contract (docs/commands.md), for the tests: it counts
STEPS steps of 0.1 s, and on the preemption signal writes its step to a checkpoint and exits 75; on a restart
it resumes from its checkpoint and runs the steps left at once (the launcher's signal comes again a fixed time into
every launch: a resumed launch that had to outrun it would pass only on a quiet machine). At the end each rank writes done-RANK.json (step, where it resumed, restart)."""

import json
import os
import signal
import sys
import time

stop = []
signal.signal(signal.SIGUSR2, lambda *_: stop.append(1))
rank = os.environ["RANK"]
checkpoint = os.path.join(os.environ["HPC_TRAIN_CHECKPOINT_DIR"], f"rank-{rank}.json")
step = json.load(open(checkpoint))["step"] if os.path.exists(checkpoint) else 0
resumed_from = step
steps = int(sys.argv[1])
run_dir = os.environ["HPC_TRAIN_RUN_DIR"]
with open(os.path.join(run_dir, f"started-{rank}-{os.environ['HPC_TRAIN_RESTART']}"), "w"):
    pass
while step < steps:
    if stop:
        with open(checkpoint + ".tmp", "w") as handle:
            json.dump({"step": step}, handle)
        os.replace(checkpoint + ".tmp", checkpoint)
        print(f"rank {rank}: checkpointed at step {step}", flush=True)
        time.sleep(0.5)  # every rank has written its own before any exits (srun --kill-on-bad-exit)
        sys.exit(int(os.environ["HPC_TRAIN_EXIT_REQUEUE"]))
    time.sleep(0.1 if os.environ["HPC_TRAIN_RESTART"] == "0" else 0)
    step += 1
with open(os.path.join(run_dir, f"done-{rank}.json"), "w") as handle:
    json.dump({"step": step, "resumed_from": resumed_from, "restart": int(os.environ["HPC_TRAIN_RESTART"])}, handle)
