"""Stand-ins for Slurm's scontrol and squeue, and for systemctl as far as the Slurm daemons go (the ladder's live,
slurm and check rungs; a real slurmctld/slurmd and systemd cannot run here).

The state lives in the JSON file named by $HPC_TRAIN_FAKE_SLURM:
  node              one node: name, state, reason
  jobs, polls_until_done   its running job ids, and after how many squeue polls they end (null: never)
  config            Slurm's running configuration (scontrol show config), over DEFAULT_CONFIG
  slurm_conf        optional path of the controller's slurm.conf: `systemctl restart slurmctld` loads its keys into
                    config, as a restarted slurmctld would
  machine           optional {root, kernel, loaded_version_file}: `scontrol reboot` "boots" the node: the driver loaded
                    is the nvidia.ko built for that kernel in that root (or none), and the node comes back DOWN
Every call is appended to "calls" with its time, so a test can check what was asked, and in which order relative to
other changes. Only the invocations the roles make are understood; anything else exits 2.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fake_repos"))
import kmod_elf  # noqa: E402

DEFAULT_CONFIG = {
    "GresTypes": "(null)", "PluginDir": "/usr/lib64/slurm", "PropagateResourceLimits": "ALL",
    "PropagateResourceLimitsExcept": "(null)", "RebootProgram": "/usr/sbin/reboot", "SlurmctldParameters": "(null)",
    "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_VERSION": "23.11.10",
}
# slurm.conf keys the stand-in slurmctld takes from the file (case-insensitive, as in Slurm).
LOADED_KEYS = ["GresTypes", "PropagateResourceLimits", "PropagateResourceLimitsExcept", "RebootProgram", "SlurmctldParameters"]


def show_config(state: dict) -> str:
    config = {**DEFAULT_CONFIG, **state.get("config", {})}
    lines = ["Configuration data as of 2026-11-29T22:00:00"]
    lines += [f"{key:<30} = {value}" for key, value in sorted(config.items())]
    return "\n".join(lines)


def restart_slurmctld(state: dict) -> None:
    """Load the controller's slurm.conf as slurmctld does on a restart (Except set -> PropagateResourceLimits unset)."""
    if not state.get("slurm_conf"):
        return
    found = {}
    for line in Path(state["slurm_conf"]).read_text().splitlines():
        match = re.match(r"\s*(\w+)\s*=\s*(\S+)", line)
        if match:
            key = next((k for k in LOADED_KEYS if k.lower() == match.group(1).lower()), None)
            if key:
                found[key] = match.group(2)
    config = state.setdefault("config", {})
    for key in ("GresTypes", "RebootProgram", "SlurmctldParameters"):
        config[key] = found.get(key, "(null)")
    if "PropagateResourceLimitsExcept" in found:
        config["PropagateResourceLimits"], config["PropagateResourceLimitsExcept"] = "(null)", found["PropagateResourceLimitsExcept"]
    else:
        config["PropagateResourceLimits"], config["PropagateResourceLimitsExcept"] = found.get("PropagateResourceLimits", "ALL"), "(null)"


def reboot(state: dict, reason: str) -> None:
    """The node boots: its kernel loads the nvidia.ko built for it (if any); nextstate=DOWN keeps it out of service."""
    machine = state["machine"]
    modules = Path(machine["root"]) / "lib" / "modules" / machine["kernel"]
    built = sorted(modules.rglob("nvidia.ko*")) if modules.exists() else []
    loaded = Path(machine["loaded_version_file"])
    if built:
        info = kmod_elf.read_modinfo(built[0])
        kind = "Open Kernel Module for x86_64" if info.get("license") == kmod_elf.LICENSE["open"] else "x86_64 Kernel Module"
        loaded.write_text(f"NVRM version: NVIDIA UNIX {kind}  {info['version']}  Release Build  (stand-in)\n"
                          "GCC version:  gcc version 11.5.0 20240719 (Red Hat 11.5.0-2) (GCC)\n")
    else:
        loaded.unlink(missing_ok=True)
    state["node"]["state"], state["node"]["reason"] = "DOWN", f"{reason} : reboot complete"


def main(program: str, args: list[str]) -> int:
    path = Path(os.environ["HPC_TRAIN_FAKE_SLURM"])
    # Ansible runs the hosts of a play in parallel: one call at a time reads and writes the state.
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return handle(path, program, args)


def handle(path: Path, program: str, args: list[str]) -> int:
    state = json.loads(path.read_text())
    state["calls"].append({"time": time.time(), "argv": [program, *args]})
    node = state.get("node", {"name": "", "state": "IDLE", "reason": ""})
    code = 0
    if program == "scontrol" and args[:3] == ["--oneliner", "show", "node"]:
        if args[3] != node["name"]:
            print(f"Node {args[3]} not found")
            code = 1
        else:
            reason = f" Reason={node['reason']} [root@2026-11-29T22:00:00]" if node["reason"] else ""
            print(f"NodeName={node['name']} Arch=x86_64 CPUAlloc=0 CPUTot=96 State={node['state']} Gres=gpu:h100:8{reason}")
    elif program == "scontrol" and args == ["show", "config"]:
        print(show_config(state))
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
    elif program == "scontrol" and args[:3] == ["reboot", "ASAP", "nextstate=DOWN"] and len(args) == 5:
        reason = args[3].removeprefix("reason=")
        if args[4] != node["name"] or not args[3].startswith("reason="):
            code = 1
        else:
            reboot(state, reason)
    elif program == "squeue" and "--noheader" in args and "--format=%i" in args:
        if state["polls_until_done"] is not None:
            state["polls_until_done"] -= 1
            if state["polls_until_done"] <= 0:
                state["jobs"] = []
                node["state"] = node["state"].replace("MIXED", "IDLE")
        print("\n".join(state["jobs"]))
    elif program == "systemctl" and args[:1] in (["restart"], ["try-restart"]) and len(args) == 2:
        if args[1] == "slurmctld.service":
            restart_slurmctld(state)
    elif program == "systemctl" and args == ["daemon-reload"]:
        pass
    else:
        print(f"fake {program}: unexpected arguments {args}", file=sys.stderr)
        code = 2
    path.write_text(json.dumps(state, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).name, sys.argv[2:]))
