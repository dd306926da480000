"""Stand-ins for Slurm's scontrol and squeue, and for systemctl as far as the roles' units go (the ladder's live and
check rungs; the Slurm side of the roles is tested against the real Slurm, rungs_slurm.py). systemctl knows the
units of the node's root: `enable` links only what a unit's [Install] section wants (as systemd does), `start`
and `show`/`is-active` keep a unit's state ("units"); it cannot show systemd itself (ordering, failures at start).

The state lives in the JSON file named by $HPC_TRAIN_FAKE_SLURM:
  node              one node: name, state, reason
  jobs, polls_until_done   its running job ids, and after how many squeue polls they end (null: never)
  config            Slurm's running configuration (scontrol show config), over DEFAULT_CONFIG
  machine           optional {root, kernel, loaded_version_file, boot_id_file, module_loads, boot_s}: `scontrol reboot`
                    "boots" the node into GRUB's default kernel (the root's grubby stand-in, else "kernel"): the driver
                    loaded is the nvidia.ko built for it in that root (none when there is none, module_loads is false, or
                    Secure Boot is on and no enrolled certificate verifies its signature: fake_secure_boot/),
                    a new boot id (a new boot time), and the node comes back as Slurm's node_mgr.c returns it (see reboot)
  history           every change of the node's state and reason, with its time: what Slurm would have scheduled on
  units             {unit: active | inactive | failed}: the node's systemd units (systemctl); a failed one fails to start
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
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fake_repos"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kmod_elf  # noqa: E402
from fake_secure_boot import secure_boot  # noqa: E402

DEFAULT_CONFIG = {
    "GresTypes": "(null)", "PluginDir": "/usr/lib64/slurm", "PropagateResourceLimits": "ALL",
    "PropagateResourceLimitsExcept": "(null)", "RebootProgram": "/usr/sbin/reboot", "SlurmctldParameters": "(null)",
    "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_VERSION": "23.11.10",
    # Slurm's defaults (slurm.conf(5)): a DOWN node stays DOWN; a reboot not complete within 60 s has timed out.
    "ReturnToService": "0", "ResumeTimeout": "60 sec",
}
BOOT_S = 30  # how long the stand-in machine takes to boot, unless machine.boot_s says otherwise


def show_config(state: dict) -> str:
    config = {**DEFAULT_CONFIG, **state.get("config", {})}
    lines = ["Configuration data as of 2026-11-29T22:00:00"]
    lines += [f"{key:<30} = {value}" for key, value in sorted(config.items())]
    return "\n".join(lines)


def boot_kernel(machine: dict) -> str:
    """GRUB's default kernel in the root (the grubby stand-in's /boot/grub2/grubenv), else the configured one."""
    grubenv = Path(machine["root"]) / "boot" / "grub2" / "grubenv"
    found = re.search(r"^saved_entry=(\S+)$", grubenv.read_text(), re.M) if grubenv.exists() else None
    return found.group(1) if found else machine["kernel"]


def reboot(state: dict, reason: str, next_state: str) -> None:
    """The node boots GRUB's default kernel, which loads the nvidia.ko built for it (if any, and if it loads)."""
    machine = state["machine"]
    machine["kernel"] = boot_kernel(machine)
    running = Path(machine["root"]) / "etc" / "hpc-train-stand-in" / "running-kernel"
    running.parent.mkdir(parents=True, exist_ok=True)
    running.write_text(machine["kernel"] + "\n")
    if machine.get("boot_id_file"):
        Path(machine["boot_id_file"]).write_text(f"{uuid.uuid4()}\n")
    modules = Path(machine["root"]) / "lib" / "modules" / machine["kernel"]
    built = sorted(modules.rglob("nvidia.ko*")) if modules.exists() and machine.get("module_loads", True) else []
    # Under Secure Boot the kernel loads only a module whose signature an enrolled certificate verifies (real openssl).
    built = [module for module in built if secure_boot.module_loads(module, Path(machine["root"]))]
    loaded = Path(machine["loaded_version_file"])
    if built:
        info = kmod_elf.read_modinfo(built[0])
        kind = "Open Kernel Module for x86_64" if info.get("license") == kmod_elf.LICENSE["open"] else "x86_64 Kernel Module"
        loaded.write_text(f"NVRM version: NVIDIA UNIX {kind}  {info['version']}  Release Build  (stand-in)\n"
                          "GCC version:  gcc version 11.5.0 20240719 (Red Hat 11.5.0-2) (GCC)\n")
    else:
        loaded.unlink(missing_ok=True)
    come_back(state, reason, next_state)


def come_back(state: dict, reason: str, next_state: str) -> None:
    """The node's state once it registers after `scontrol reboot`, as node_mgr.c decides it (modelled; the real_slurm
    rung shows 22.05 returning a nextstate=DOWN reboot IDLE under ReturnToService=2):
      - a boot longer than ResumeTimeout: Slurm gave up first (DOWN, "reboot timed out": the reason is Slurm's, the
        nextstate and any reason given are lost); the late registration then returns it to service under
        ReturnToService=2, and a DRAIN flag set before stays;
      - nextstate=RESUME: in service; nextstate=DOWN: DOWN "<reason> : reboot complete", but ReturnToService=2 returns
        a DOWN node to service at its registration;
      - no nextstate: the state it had, DRAIN flag and reason included (ReturnToService never clears a DRAIN)."""
    config = {**DEFAULT_CONFIG, **state.get("config", {})}
    return_to_service = config["ReturnToService"].strip() == "2"
    resume_timeout_s = int(config["ResumeTimeout"].split()[0])
    node = state["node"]
    drained = "DRAIN" in node["state"]
    if state["machine"].get("boot_s", BOOT_S) > resume_timeout_s:
        node["reason"] = "reboot timed out"
        node["state"] = ("IDLE" if return_to_service else "DOWN") + ("+DRAIN" if drained else "")
    elif next_state == "RESUME" or (next_state == "DOWN" and return_to_service):
        node["state"], node["reason"] = "IDLE", ""
    elif next_state == "DOWN":
        node["state"], node["reason"] = "DOWN", f"{reason} : reboot complete"
    else:
        node["state"] = "IDLE+DRAIN" if drained else "IDLE"


def systemctl(state: dict, args: list[str]) -> int:
    """The node's systemd, as far as the roles ask: show, is-active, is-enabled, start, enable, daemon-reload."""
    args = [arg for arg in args if arg != "-l"]  # is-enabled -l: the full unit names
    if args == ["daemon-reload"]:
        return 0
    if len(args) != 2:
        return 2
    verb, unit = args[0], args[1] if args[1].endswith(".service") else args[1] + ".service"
    root = Path(state.get("machine", {}).get("root", "/nonexistent"))
    unit_file = next((p for p in (root / "etc/systemd/system" / unit, root / "usr/lib/systemd/system" / unit) if p.exists()), None)
    units = state.setdefault("units", {})
    active = units.get(unit, "inactive")
    if verb == "is-active":
        print(active)
        return 0 if active == "active" else 3
    if verb == "show":
        wanted = root / "etc/systemd/system/multi-user.target.wants" / unit
        print(f"Id={unit}\nLoadState={'loaded' if unit_file else 'not-found'}\nActiveState={active}\n"
              f"SubState={'running' if active == 'active' else 'dead'}\nUnitFileState={'enabled' if wanted.is_symlink() else 'disabled'}")
        return 0
    if verb == "is-enabled" and unit_file:
        # systemd's answers: a unit without [Install] is "static" (exit 0), though nothing will start it.
        wanted = root / "etc/systemd/system/multi-user.target.wants" / unit
        answer = "enabled" if wanted.is_symlink() else ("disabled" if "[Install]" in unit_file.read_text() else "static")
        print(answer)
        return 1 if answer == "disabled" else 0
    if verb == "start" and unit_file:
        if active == "failed":  # a unit that fails at start (its daemon exits): stays failed, as systemctl says
            print(f"Job for {unit} failed because the control process exited with error code.", file=sys.stderr)
            return 1
        units[unit] = "active"
        return 0
    if verb == "enable" and unit_file:
        target = re.search(r"(?ms)^\[Install\].*?^WantedBy=(\S+)", unit_file.read_text())
        if target is None:  # systemd: "The unit files have no installation config", nothing enabled
            print(f"The unit files have no installation config (WantedBy=, RequiredBy=, ...); {unit} is not enabled.", file=sys.stderr)
            return 0
        link = root / "etc/systemd/system" / (target.group(1) + ".wants") / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(f"/usr/lib/systemd/system/{unit}")
        return 0
    return 1 if unit_file is None else 2


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
    before = (node["state"], node["reason"])
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
    elif program == "scontrol" and args[:2] == ["reboot", "ASAP"] and args[2] in ("nextstate=DOWN", "nextstate=RESUME") and len(args) == 5:
        reason = args[3].removeprefix("reason=")
        if args[4] != node["name"] or not args[3].startswith("reason="):
            code = 1
        else:
            reboot(state, reason, args[2].removeprefix("nextstate="))
    elif program == "scontrol" and args[:1] == ["reboot"] and len(args) == 2:  # once idle, back in the state it had
        if args[1] != node["name"]:
            code = 1
        else:
            reboot(state, "", "")
    elif program == "squeue" and "--noheader" in args and "--format=%i" in args:
        if state["polls_until_done"] is not None:
            state["polls_until_done"] -= 1
            if state["polls_until_done"] <= 0:
                state["jobs"] = []
                node["state"] = node["state"].replace("MIXED", "IDLE")
        print("\n".join(state["jobs"]))
    elif program == "systemctl":
        code = systemctl(state, args)
    else:
        print(f"fake {program}: unexpected arguments {args}", file=sys.stderr)
        code = 2
    if (node["state"], node["reason"]) != before:
        state.setdefault("history", []).append({"time": time.time(), "state": node["state"], "reason": node["reason"]})
    path.write_text(json.dumps(state, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).name, sys.argv[2:]))
