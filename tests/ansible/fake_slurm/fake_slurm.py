"""Stand-ins for Slurm's scontrol and squeue, for the live-node driver-change test only.

The state lives in the JSON file named by $HPC_TRAIN_FAKE_SLURM: one node (name, state, reason), its running
job ids, and after how many squeue polls the jobs end (null: never). Every call is appended to "calls" with its
time, so the test can check what the role asked Slurm, and in which order relative to the package changes.
Only the invocations nvidia_driver makes are understood; anything else exits 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(program: str, args: list[str]) -> int:
    path = Path(os.environ["HPC_TRAIN_FAKE_SLURM"])
    state = json.loads(path.read_text())
    state["calls"].append({"time": time.time(), "argv": [program, *args]})
    node = state["node"]
    code = 0
    if program == "scontrol" and args[:3] == ["--oneliner", "show", "node"]:
        if args[3] != node["name"]:
            print(f"Node {args[3]} not found")
            code = 1
        else:
            reason = f" Reason={node['reason']} [root@2026-11-29T22:00:00]" if node["reason"] else ""
            print(f"NodeName={node['name']} Arch=x86_64 CPUAlloc=0 CPUTot=96 State={node['state']} Gres=gpu:h100:8{reason}")
    elif program == "scontrol" and args[:1] == ["update"]:
        fields = dict(arg.split("=", 1) for arg in args[1:])
        if fields.get("NodeName") != node["name"]:
            code = 1
        elif fields.get("State") == "DRAIN":
            node["state"] = ("MIXED" if state["jobs"] else "IDLE") + "+DRAIN"
            node["reason"] = fields.get("Reason", "")
        elif fields.get("State") == "RESUME":
            node["state"], node["reason"] = ("MIXED" if state["jobs"] else "IDLE"), ""
        else:
            code = 2
    elif program == "squeue" and "--noheader" in args and "--format=%i" in args:
        if state["polls_until_done"] is not None:
            state["polls_until_done"] -= 1
            if state["polls_until_done"] <= 0:
                state["jobs"] = []
                node["state"] = node["state"].replace("MIXED", "IDLE")
        print("\n".join(state["jobs"]))
    else:
        print(f"fake {program}: unexpected arguments {args}", file=sys.stderr)
        code = 2
    path.write_text(json.dumps(state, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).name, sys.argv[2:]))
