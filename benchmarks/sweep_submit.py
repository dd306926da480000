"""What one submit of a large sweep costs on the submit side: seconds and bytes written, with stand-in Slurm
tools (``sbatch`` answers at once, ``scontrol show config`` gives MaxArraySize), so only hpc-train's own work
is measured. ``python benchmarks/sweep_submit.py [POINTS]`` prints one JSON line.

What it cannot show: a real slurmctld's time to accept an array (the Slurm suite submits real ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STUB = """#!/bin/bash
name=$(basename "$0")
case "$name" in
    sbatch) n=$(( $(cat "$STUB_DIR/count" 2>/dev/null || echo 100) + 1 )); echo "$n" > "$STUB_DIR/count"
            wc -c < "${@: -1}" >> "$STUB_DIR/script-bytes"; echo "Submitted batch job $n" ;;
    scontrol) echo "MaxArraySize            = ${STUB_MAX_ARRAY_SIZE:-1001}" ;;
    sinfo) echo "slurm 22.05.8" ;;
esac
exit 0
"""


def tree_bytes(path: Path) -> tuple[int, int]:
    total, files = 0, 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            total += os.lstat(os.path.join(dirpath, name)).st_size
            files += 1
    return total, files


def measure(points: int, max_array_size: int = 1001) -> dict:
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        work = Path(tmp)
        stubs = work / "bin"
        stubs.mkdir()
        for tool in ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol", "sacct"):
            (stubs / tool).write_text(STUB)
            (stubs / tool).chmod(0o755)
        env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_DIR": str(work),
               "STUB_MAX_ARRAY_SIZE": str(max_array_size), "HPC_TRAIN_STATE_DIR": str(work / "state"),
               "HPC_TRAIN_SITE": str(work / "site.yaml")}
        (work / "site.yaml").write_text("{}\n")
        seeds = "[" + ",".join(str(i) for i in range(points)) + "]"
        argv = [sys.executable, "-m", "hpc_train.cli", "submit", "digits_lt_demo", "--cluster", "slurm",
                "--set", "train.device=cpu", "--sweep", f"train.seed={seeds}", "--runs-dir", str(work / "runs")]
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        written, files = tree_bytes(work / "runs")
        scripts = [int(x) for x in (work / "script-bytes").read_text().split()] if (work / "script-bytes").exists() else []
        return {"points": points, "exit_code": proc.returncode, "seconds": round(seconds, 2),
                "bytes_written": written, "files_written": files, "arrays": len(scripts),
                "script_bytes": scripts, "output": (proc.stdout + proc.stderr).strip().splitlines()[-2:]}


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 1001
    print(json.dumps(measure(count, size)))
