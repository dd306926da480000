"""A client that keeps its snapshot in its working directory, as the PyTorch DDP tutorial's ``snapshot.pt`` (and
the ImageNet example's ``checkpoint.pth.tar``) do: each rank resumes from ``snapshot-RANK.pt`` in its cwd if
there is one. Without one it writes it (naming its run) and exits 75 (checkpointed: launched again), or 0 with
``once``. Each start appends what it found to ``seen.jsonl`` in the run directory (tests/unit/local/
test_workdir_local.py, tests/real_cluster/test_commands.py)."""

import json
import os
import sys

rank = os.environ["RANK"]
run = os.path.basename(os.environ["HPC_TRAIN_RUN_DIR"])
snapshot = f"snapshot-{rank}.pt"
found = open(snapshot).read() if os.path.exists(snapshot) else None
seen = {"rank": int(rank), "restart": int(os.environ["HPC_TRAIN_RESTART"]), "cwd": os.getcwd(), "found": found,
        "submit_dir": os.environ.get("HPC_TRAIN_SUBMIT_DIR")}
with open(os.path.join(os.environ["HPC_TRAIN_RUN_DIR"], "seen.jsonl"), "a") as log:
    log.write(json.dumps(seen) + "\n")
if found is None:
    with open(snapshot, "w") as handle:
        handle.write(run)
    sys.exit(0 if sys.argv[1:] == ["once"] else int(os.environ["HPC_TRAIN_EXIT_REQUEUE"]))
