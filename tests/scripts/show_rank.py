"""Each rank records what hpc-train gave it (its argv and the mapping) in the run directory; rank FAIL_RANK
(the first argument) then fails with exit code 7, after the others have written."""

import json
import os
import sys
import time

run_dir = os.environ["HPC_TRAIN_RUN_DIR"]
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
        "HPC_TRAIN_RESTART", "HPC_TRAIN_SIGNAL", "HPC_TRAIN_EXIT_REQUEUE", "SLURMD_NODENAME")
seen = {key: os.environ.get(key) for key in keys}
with open(os.path.join(run_dir, f"seen-{seen['RANK']}.json"), "w") as handle:
    json.dump({"argv": sys.argv[1:], "env": seen}, handle)
if seen["RANK"] == sys.argv[1]:
    time.sleep(2)
    print(f"rank {seen['RANK']} fails on purpose", file=sys.stderr, flush=True)
    sys.exit(7)
time.sleep(30)  # ended by the launcher (srun --kill-on-bad-exit) when the failing rank exits
