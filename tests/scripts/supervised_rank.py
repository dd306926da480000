"""A rank for the supervision tests: it starts a child of its own (``sleep``, in the rank's process group, as a
command's helper or a data worker would be), writes both pids to ``pids-RANK.json`` in the run directory, and
waits. On SIGTERM it writes ``checkpoint-RANK`` and exits 75, as a trainer that checkpoints on the signal does."""

import json
import os
import signal
import subprocess
import sys
import time

run_dir = os.environ["HPC_TRAIN_RUN_DIR"]
rank = os.environ["RANK"]
child = subprocess.Popen(["sleep", "300"])


def checkpoint(_signum, _frame):
    with open(os.path.join(run_dir, f"checkpoint-{rank}"), "w"):
        pass
    sys.exit(int(os.environ["HPC_TRAIN_EXIT_REQUEUE"]))  # the child is left to whoever ends the process group


signal.signal(signal.SIGTERM, checkpoint)
with open(os.path.join(run_dir, f"pids-{rank}.json.tmp"), "w") as handle:
    json.dump({"rank": os.getpid(), "child": child.pid}, handle)
os.replace(os.path.join(run_dir, f"pids-{rank}.json.tmp"), os.path.join(run_dir, f"pids-{rank}.json"))
while True:
    time.sleep(0.2)
