"""The ladder's real Slurm 22.05, or 24.11 from tests/cluster's chroot (write_chroot_commands; rung real_slurm_newer)
(cluster.sh sets up munged, the bridge and one namespace "holder" per host): the
hosts' roots, their site slurm.conf before the roles run, starting the real daemons, and asking them.

Every host is this machine seen through its own namespaces (network, hostname, mounts): /etc/slurm and /run are its
root's, a GPU node has a private /dev with 4 fake GPUs. Ansible reaches a host through bin/python-<host> (an
interpreter that enters the host), so every command the roles run there — scontrol, sbatch, systemctl — runs as on
that host. What is real: slurmctld, slurmd, sbatch, scontrol, munge. What is not: the GPUs (char devices only, no
NVML), systemd (bin/systemctl), the hosts' other software; jobs run as root.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"
NET = "10.79.0"
CONTROLLER_IP = f"{NET}.1"
CTLD_PORT, SLURMD_PORT = 6917, 6918  # not the Python suites' 6817/6818
CLUSTER_NAME = "hpctrain-ansible"
GPUS_PER_NODE = 4
# The site's own file its slurm.conf includes (classic): relative to slurm.conf, %c the ClusterName, as slurm.conf(5)
# says. The keys the roles set live here, so that the roles must find them where the site keeps them.
SITE_INCLUDE = "site-%c.conf"
SITE_INCLUDE_FILE = SITE_INCLUDE.replace("%c", CLUSTER_NAME)


class RealSlurm:
    """One shape of the cluster: {host: kind} with kind controller, node or login."""

    def __init__(self, base: Path, python: Path, hosts: dict[str, str], slurm_bin: Path | None = None) -> None:
        """slurm_bin: a directory of another release's Slurm commands (write_chroot_commands), first on every host's PATH."""
        self.base, self.python, self.hosts = base, python, hosts
        self.env = {**os.environ, "HPC_TRAIN_REAL_SLURM": str(base)}
        self.env.pop("SLURM_CONF", None)
        self.env.pop("HPC_TRAIN_REAL_SLURM_BIN", None)
        if slurm_bin:
            self.env["HPC_TRAIN_REAL_SLURM_BIN"] = str(slurm_bin)

    def root(self, host: str) -> Path:
        return self.base / "roots" / host

    @property
    def controller(self) -> str:
        return next(h for h, kind in self.hosts.items() if kind == "controller")

    @functools.cached_property
    def slurm_version(self) -> str:
        """The release of the Slurm this cluster runs ($HPC_TRAIN_REAL_SLURM_BIN, else the machine's): "22.05.8"."""
        binary = Path(self.env["HPC_TRAIN_REAL_SLURM_BIN"]) / "slurmctld" if self.env.get("HPC_TRAIN_REAL_SLURM_BIN") else "slurmctld"
        said = subprocess.run([str(binary), "-V"], capture_output=True, text=True).stdout.split()
        return said[-1] if said else "?"

    def site_include(self) -> str:
        """The site's included file (classic): GresTypes without gpu and the shell's limits propagated, set here."""
        return "GresTypes=bandwidth\nPropagateResourceLimits=ALL\n"

    @property
    def newer(self) -> bool:
        """Slurm 24 or later: no task/none, and a cgroup plugin loaded unless disabled (tests/cluster/versions.sh)."""
        return tuple(int(x) for x in self.slurm_version.split(".")[:2] if x.isdigit()) >= (24, 0)

    def site_slurm_conf(self, configless: bool = False) -> str:
        """The site's own slurm.conf before hpc-train: no GPUs in GresTypes, the shell's limits propagated (in the
        included site file in classic mode; configless ships only files next to slurm.conf, so there they stay here)."""
        b = self.base
        # task/none: 22.05 has it, 24.11 no longer (leave TaskPlugin unset there).
        newer = self.newer
        return "\n".join([
            f"ClusterName={CLUSTER_NAME}", f"SlurmctldHost={self.controller}({CONTROLLER_IP})", "SlurmUser=root",
            f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}", "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={b}/munge/run/munge.socket.2", f"StateSaveLocation={b}/state", f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/run/slurmctld.pid", f"SlurmdPidFile={b}/run/slurmd-%h.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log", f"SlurmdLogFile={b}/log/slurmd-%h.log", "SlurmctldDebug=info",
            "SlurmdDebug=info", "ProctrackType=proctrack/linuxproc", *([] if newer else ["TaskPlugin=task/none"]), "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides",
            "ReturnToService=2", "MailProg=/bin/true", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "SchedulerParameters=sched_interval=1",
            *(["GresTypes=bandwidth", "PropagateResourceLimits=ALL", "SlurmctldParameters=enable_configless"] if configless
              else [f"Include {SITE_INCLUDE}"]),
            "PartitionName=gpu Nodes=ALL Default=YES MaxTime=10:00 State=UP", "",
        ])

    def write_roots(self, configless: bool) -> None:
        """Each host's files before the roles run. Classic: the same site slurm.conf everywhere. Configless: only the
        controller has one; the nodes' slurmd is started with --conf-server (SLURMD_OPTIONS, as on EL)."""
        subprocess.run(["rm", "-rf", str(self.base / "roots"), str(self.base / "state"), str(self.base / "spool")], check=True)
        for host, kind in self.hosts.items():
            etc = self.root(host) / "etc"
            (etc / "slurm").mkdir(parents=True)
            (self.root(host) / "run").mkdir()
            if kind == "controller" or not configless:
                (etc / "slurm" / "slurm.conf").write_text(self.site_slurm_conf(configless))
                if not configless:
                    (etc / "slurm" / SITE_INCLUDE_FILE).write_text(self.site_include())
                # The site's memory policy: the roles add the keys it did not set, never change this one.
                # From 24 slurmd loads the cgroup plugin even without task/cgroup, and these hosts own no delegated
                # cgroup subtree: a site like that disables it (tests/cluster/versions.sh does the same).
                plugin = "disabled" if self.newer else "autodetect"
                (etc / "slurm" / "cgroup.conf").write_text(f"CgroupPlugin={plugin}\nConstrainRAMSpace=no\n")
            if kind == "node" and configless:
                (etc / "sysconfig").mkdir()
                (etc / "sysconfig" / "slurmd").write_text(f'SLURMD_OPTIONS="--conf-server {CONTROLLER_IP}:{CTLD_PORT}"\n')
        (self.base / "spool").mkdir()
        for host, kind in self.hosts.items():
            if kind == "node":
                (self.base / "spool" / host).mkdir()

    def up(self) -> None:
        hosts_file = self.base / "hosts.txt"
        hosts_file.write_text("".join(f"{h} {kind} {self.root(h)} {GPUS_PER_NODE if kind == 'node' else 0}\n"
                                      for h, kind in self.hosts.items()))
        (self.base / "bin").mkdir(exist_ok=True)
        for host in self.hosts:  # the interpreter Ansible uses for the host: Python inside the host's namespaces
            wrapper = self.base / "bin" / f"python-{host}"
            wrapper.write_text(f'#!/bin/sh\nexec {HERE / "bin" / "in-host"} {host} {self.python} "$@"\n')
            wrapper.chmod(0o755)
        (self.base / "systemctl-calls.jsonl").unlink(missing_ok=True)
        result = subprocess.run(["bash", str(CLUSTER_SH), "up", str(self.base), str(hosts_file)], capture_output=True, text=True,
                                env=self.env)
        if result.returncode != 0:
            raise RuntimeError(f"real_slurm/cluster.sh up failed:\n{result.stdout}{result.stderr}")

    def down(self) -> subprocess.CompletedProcess:
        for host in self.hosts:  # hung stand-ins left their checks' process groups: nothing else ends them
            for pid in self.hung_smi_pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return subprocess.run(["bash", str(CLUSTER_SH), "down", str(self.base)], capture_output=True, text=True, env=self.env)

    def in_host(self, host: str, *argv: str, timeout_s: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([str(HERE / "bin" / "in-host"), host, *argv], capture_output=True, text=True, env=self.env,
                              timeout=timeout_s, **kwargs)

    def systemctl(self, host: str, *args: str) -> subprocess.CompletedProcess:
        """Start or restart a daemon the way the roles do (bin/systemctl, inside the host)."""
        return self.in_host(host, str(HERE / "bin" / "systemctl"), *args)

    def wait(self, what: str, probe, timeout_s: float = 30, poll_s: float = 0.3):
        deadline = time.monotonic() + timeout_s
        while True:
            value = probe()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(poll_s)

    def controller_up(self) -> bool:
        return "is UP" in self.in_host(self.controller, "scontrol", "ping").stdout

    def nodes(self) -> dict[str, dict]:
        """NodeName -> the fields of `scontrol show node --oneliner` (as slurmctld knows them)."""
        out = self.in_host(self.controller, "scontrol", "--oneliner", "show", "node").stdout
        found = {}
        for line in out.splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            reason = re.search(r" Reason=(.*?) \[[^\]]*\]", line)  # the one value with spaces: "text [user@time]"
            if reason:
                fields["Reason"] = reason.group(1)
            if "NodeName" in fields:
                found[fields["NodeName"]] = fields
        return found

    def wait_nodes(self, names: list[str], state: str = "IDLE", timeout_s: float = 30) -> dict[str, dict]:
        """Until every node is in `state` (no DRAIN, INVAL, NOT_RESPONDING...), or the timeout; the last answer."""
        seen: dict = {}

        def probe():
            seen.update(nodes=self.nodes())
            return all(seen["nodes"].get(n, {}).get("State") == state for n in names)
        self.wait("nodes", probe, timeout_s)
        return seen["nodes"]

    def sbatch_wait(self, host: str, script: str, output: Path, timeout_s: float = 60) -> subprocess.CompletedProcess:
        """sbatch --wait from `host` (its own slurm.conf, its own shell limits in `script`'s first lines)."""
        output.unlink(missing_ok=True)
        return self.in_host(host, "bash", "-c", script.replace("OUTPUT", str(output)), timeout_s=timeout_s)

    def memlock_kib(self, host: str) -> str:
        """The locked-memory limit slurmd on `host` runs with, as `ulimit -l` prints it (KiB or unlimited)."""
        try:
            pid = int((self.base / "run" / f"slurmd-{host}.pid").read_text())
            line = next(l for l in Path(f"/proc/{pid}/limits").read_text().splitlines() if l.startswith("Max locked memory"))
        except (OSError, ValueError, StopIteration):
            return "?"
        soft = line.split()[3]
        return soft if soft == "unlimited" else str(int(soft) // 1024)

    def logs(self, lines: int = 12) -> str:
        out = []
        for log in sorted((self.base / "log").glob("*.log")) + sorted((self.base / "log").glob("*.out")):
            text = log.read_text(errors="replace").strip().splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def fake_gpus(self, host: str, driver: str = "570.172.08", **state) -> None:
        """The GPUs the health check on `host` sees: a stand-in nvidia-smi (bin/nvidia-smi-<host>) with its own state,
        4 GPUs on `driver` unless `state` says otherwise (gpus=3, gpu_fields={...}, hang=True, warning=...)."""
        loaded = self.base / f"driver-{host}"
        line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (stand-in)\n"
        loaded.write_text(line.format(driver))
        path = self.base / f"gpu-{host}.json"
        # H100s whose NVSwitch fabric is up (what an HGX node's GPUs report once nvidia-fabricmanager has set them up)
        path.write_text(json.dumps({"loaded_version_file": str(loaded), "gpus": GPUS_PER_NODE, "fabric": ["Completed", "Success"], **state}))
        wrapper = self.base / "bin" / f"nvidia-smi-{host}"
        # A hung nvidia-smi is in D state on a real node, where the SIGKILL that slurmd sends the check's process group
        # once the check ends does nothing (Slurm's run_command_waitpid_timeout: `_kill_pg(pid); /* kill children too
        # */`). The stand-in would die of it, and the next check would start another: so a hanging one leaves the
        # check's group (setsid keeps the pid the check recorded), as a process in D state outlives the kill.
        escape = "setsid " if state.get("hang") else ""
        # Every call is logged first (health_checks_run counts the check's runs by it).
        wrapper.write_text(f'#!/bin/sh\necho "$*" >>{self.smi_calls(host)}\n'
                           f'HPC_TRAIN_FAKE_GPU={path} exec {escape}{HERE.parent / "fake_gpu" / "bin" / "nvidia-smi"} "$@"\n')
        wrapper.chmod(0o755)

    def smi_calls(self, host: str) -> Path:
        return self.base / f"nvidia-smi-calls-{host}"

    def health_checks_run(self, host: str) -> int:
        """How many gpu_health checks on `host` have asked its stand-in nvidia-smi for its GPUs (one query per check
        that is not held up by a hung nvidia-smi). Checks run one at a time (the check's lock), so once the count is
        k + 1, check k has ended: whatever it was going to do to the node's state, it has done."""
        try:
            lines = self.smi_calls(host).read_text().splitlines()
        except FileNotFoundError:
            return 0
        return sum(line.startswith("--query-gpu=index,driver_version,") for line in lines)

    @contextlib.contextmanager
    def health_checks_held(self, host: str):
        """No gpu_health check runs on `host` meanwhile: the check's own lock (one in progress is waited for, one that
        starts meanwhile leaves at once, as the check does beside another). For what a real node changes all at once,
        a reboot: a check that read the GPUs before it and the boot id after it would mix two boots."""
        with open(self.root(host) / "run" / "hpc-train-gpu-health" / "check.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def wait_health_checks(self, host: str, checks: int, timeout_s: float = 60) -> bool:
        """Until `checks` whole health checks on `host` have run from now on, each seeing the GPUs as they are now (a
        check that asked nvidia-smi before now is not counted): a condition, not a time, so a busy machine cannot make
        "still drained after two checks" pass before any check ran. False at the timeout."""
        wanted = self.health_checks_run(host) + checks + 1  # the (checks + 1)-th query starts after the checks-th check ended
        return bool(self.wait(f"{checks} health checks on {host}", lambda: self.health_checks_run(host) >= wanted, timeout_s))

    def hung_smi_pids(self, host: str) -> list[int]:
        """The stand-in nvidia-smi processes of `host` that hang (state hang=True): the check must not pile them up."""
        marker = str(self.base / f"gpu-{host}.json")
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and marker in (proc / "environ").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
        return pids

    def calls(self) -> list[dict]:
        path = self.base / "systemctl-calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# The commands of another Slurm release the ladder runs from a chroot of tests/cluster (slurm-chroot VERSION).
CHROOT_COMMANDS = ("slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "sinfo", "srun", "scancel")
IN_CHROOT = HERE.parent.parent / "cluster" / "in-chroot"
REPO = HERE.parent.parent.parent


def write_chroot_commands(chroot: Path, dest: Path) -> Path:
    """One wrapper per command of CHROOT_COMMANDS in `dest` (for $HPC_TRAIN_REAL_SLURM_BIN): run inside a host (in-host),
    it enters the chroot through tests/cluster/in-chroot, which copies the host's mount namespace, so the chroot sees
    that host's /etc/slurm, /run, /etc/hosts and /dev (its fake GPUs), and the checkout (the cluster's state directory,
    the stand-ins) at the same paths. A wrapper already inside the chroot (the health check slurmd runs there calls
    the scontrol path the role found on the host at deploy time) runs the chroot's own command."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in CHROOT_COMMANDS:
        inside = next((f"/usr/{d}/{name}" for d in ("sbin", "bin") if (chroot / "usr" / d / name).exists()), None)
        if inside is None:
            raise RuntimeError(f"{chroot} has no {name}")
        wrapper = dest / name
        wrapper.write_text(
            f"#!/bin/sh\n# Slurm's {name} from {chroot}, with this host's files (real_slurm/harness.py, write_chroot_commands)\n"
            f"[ -e /.hpctrain-recipe ] && exec {inside} \"$@\"  # inside the chroot already\n"
            f"HPCTRAIN_CHROOT_HOSTS=/etc/hosts exec {shlex.quote(str(IN_CHROOT))} {shlex.quote(str(chroot))} "
            f"{shlex.quote(f'{REPO}:/etc/slurm:/run')} {name} \"$@\"\n")
        wrapper.chmod(0o755)
    return dest
