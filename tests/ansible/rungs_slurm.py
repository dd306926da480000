"""The real_slurm rung: what the roles write for Slurm, read by Slurm 22.05 itself (another release's binaries with
$HPC_TRAIN_REAL_SLURM_BIN; the check names the version that ran) (slurmctld, slurmd, sbatch,
scontrol) on the ladder's own small cluster (real_slurm/): a controller, GPU nodes gpu01 and gpu02 (Slurm NodeName
gpu-b02) with 4 fake GPUs each, and a login host, each in its own namespaces with its own /etc/slurm.

classic     every host reads its own slurm.conf, which keeps GresTypes and PropagateResourceLimits in a site file it
            includes (Include site-%c.conf): check mode writes nothing (DCGM on, not installed); a run limited to
            gpu01 and the login host refuses gpu01's NHC HealthCheckProgram (set in its included file) and gives the
            login host no Include of a file it lacks; a run on gpu02, whose included file defines its NodeName, is
            refused; site.yml --tags slurm sets each key in the file the site set it in (real slurmctld reports
            GresTypes=bandwidth,gpu); then the real slurmctld and slurmd (started as EL's units start them,
            without -N: slurmd finds its NodeName by its host name) register both nodes with their GPUs; a job
            submitted from the login host with a 64 KiB shell MEMLOCK runs with slurmd's unlimited one; the gpu_health
            check run by the real slurmd drains a node with a lost GPU (by Slurm's Gres count) or an ECC error (reason
            gpu_health: ...), resumes it once healthy, and leaves an admin's drain alone; drains a node whose nvidia-smi
            never returns without piling up nvidia-smis; ignores nvidia-smi's stderr; a login host whose slurm.conf
            the site owns is refused, and its job gets the shell's limit
configless  the nodes have no slurm.conf and run slurmd --conf-server: refused while slurmd has fetched nothing;
            registered with the controller's gres.conf lines; scontrol on a node names slurmctld's SLURM_CONF; a rerun
            that changes the controller restarts slurmctld, then slurmd, which fetches the new files

The Python suites' cluster (tests/cluster) is stopped first: never two clusters at once on one machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import ladder_lib as lib
from real_slurm.harness import SITE_INCLUDE, SITE_INCLUDE_FILE, RealSlurm

NODES = {"gpu01": "gpu01", "gpu02": "gpu-b02"}  # host -> Slurm NodeName
HEALTH_CHECK = "/run/hpc-train/gpu-health-check"
INSTALLED_DRIVER = "/run/hpc-train/nvidia-driver-installed"  # what nvidia_driver writes for the check (in /run here)
# The node's boot id (a file the rung changes to stand for a reboot) and where the check keeps the boot an Xid drain was
# seen in (/var/lib on a real node; here the host's own /run root, which the stand-in reboot leaves alone as a disk would).
BOOT_ID = "/run/hpc-train/boot_id"
XID_BOOT = "/run/hpc-train/xid-drain-boot"
SMI_TIMEOUT_S = 3  # what the health check gives nvidia-smi here (gpu_health_command_timeout_s)
CLASSIC = {"slurmctl": "controller", "gpu01": "node", "gpu02": "node", "login01": "login"}
CONFIGLESS = {"slurmctl": "controller", "gpu01": "node", "gpu02": "node"}
# A GPU job from the login host, whose shell has a 64 KiB locked-memory limit: the job prints its limit and its GPU.
GPU_JOB = """ulimit -l 64 && sbatch --wait --quiet -N1 --gpus=1 -o OUTPUT --wrap 'echo "$(ulimit -l) $CUDA_VISIBLE_DEVICES"'"""


def real_slurm(ladder, venv: Path) -> None:
    base = lib.WORK / "real-slurm"
    down = subprocess.run([str(lib.REPO / "tests" / "cluster" / "slurm-down")], capture_output=True, text=True)
    if not ladder.check("real_slurm/the Python suites' cluster is stopped first (one cluster at a time)", down.returncode == 0,
                        down.stdout + down.stderr):
        return
    base.mkdir(parents=True, exist_ok=True)
    cluster = RealSlurm(base, venv / "bin" / "python", CLASSIC)
    try:
        classic(ladder, venv, cluster)
        cluster.down()
        cluster.hosts = CONFIGLESS
        configless(ladder, venv, cluster)
    finally:
        stop_and_check_clean(ladder, cluster, base, "real_slurm")


def stop_and_check_clean(ladder, cluster: RealSlurm, base: Path, rung: str) -> None:
    """Stop the rung's cluster and check nothing of it is left (tests/cluster/check-clean --ours)."""
    stopped = cluster.down()
    clean = subprocess.run([str(lib.REPO / "tests" / "cluster" / "check-clean"), "--ours"], capture_output=True, text=True,
                           env={**cluster.env, "HPCTRAIN_SLURM_DIR": str(base), "HPCTRAIN_SLURM_BRIDGE": "br-hpct-ans"})
    ladder.check(f"{rung}/the cluster is stopped, nothing of it left (tests/cluster/check-clean --ours)",
                 stopped.returncode == 0 and clean.returncode == 0, stopped.stdout + stopped.stderr + clean.stdout)


def play(cluster: RealSlurm, venv: Path, label: str, *extra: str, limit: str = "") -> tuple[subprocess.CompletedProcess, list[dict]]:
    record = lib.WORK / f"real-slurm-{label}.jsonl"
    env = lib.ansible_env(venv, record, **{k: v for k, v in cluster.env.items() if k == "HPC_TRAIN_REAL_SLURM"})
    env["PATH"] = f"{lib.HERE / 'real_slurm' / 'bin'}:{env['PATH']}"  # its systemctl; Slurm's own commands
    result = lib.run([str(venv / "bin" / "ansible-playbook"), "-i", str(lib.HERE / "inventories" / "real_slurm" / "hosts.yml"),
                      "--limit", limit or ",".join(cluster.hosts), "-e", f"@{lib.EXAMPLE / 'group_vars' / 'all' / 'gpu_stack.yml'}",
                      "--tags", "slurm,health", "--skip-tags", "packages", "-e", f"fixtures_dir={lib.HERE / 'fixtures'}",
                      "-e", f"real_slurm_dir={cluster.base}", "-e", "gpu_stack_manage_services=true",
                      # The health check where the nodes' namespaces see their own root (/run), checked every 2 s, nvidia-smi
                      # given 3 s; no DCGM. Deployed for 8 GPUs (one image for 4- and 8-GPU nodes): it must go by Slurm's 4.
                      "-e", f"gpu_stack_health_check_program={HEALTH_CHECK}", "-e", "slurm_gpu_node_health_check_interval_s=2",
                      "-e", f"gpu_health_command_timeout_s={SMI_TIMEOUT_S}", "-e", "gpu_health_expected_gpus=8",
                      "-e", "gpu_health_dcgm=false", "-e", f"gpu_health_expected_driver_file={INSTALLED_DRIVER}",
                      "-e", f"gpu_health_boot_id_file={BOOT_ID}", "-e", f"gpu_health_xid_boot_file={XID_BOOT}",
                      *extra, "slurm_site.yml"], env, lib.WORK / "logs" / f"real-slurm-{label}.log")
    return result, lib.read_records(record)


def failures(records: list[dict]) -> dict[str, str]:
    return {host: (lib.first_failure(records, host) or {}).get("msg", "") for host in {r["host"] for r in records}
            if lib.first_failure(records, host)}


def conf_lines(cluster: RealSlurm, host: str, name: str = "slurm.conf") -> list[str]:
    path = cluster.root(host) / "etc" / "slurm" / name
    return path.read_text().splitlines() if path.exists() else []


def start_slurm(cluster: RealSlurm) -> dict[str, dict]:
    cluster.systemctl(cluster.controller, "start", "slurmctld.service")
    cluster.wait("slurmctld", cluster.controller_up, 20)
    for host in NODES:
        cluster.systemctl(host, "start", "slurmd.service")
    return cluster.wait_nodes(list(NODES.values()))


def registered_with_gpus(nodes: dict[str, dict]) -> bool:
    return all(nodes.get(n, {}).get("State") == "IDLE" and nodes[n].get("Gres") == "gpu:h100:4" for n in NODES.values())


def pci_bus(cluster: RealSlurm, host: str, nvswitches: int) -> None:
    """The PCI bus the health check on `host` reads (the inventory's gpu_health_pci_devices_path, pci-<host>): its GPUs
    and `nvswitches` NVSwitches (NVIDIA functions of class 0x0680, as on an HGX baseboard), in the fixtures' layout."""
    machine = cluster.base / f"pci-{host}-machine"
    shutil.rmtree(machine, ignore_errors=True)
    lib.build_fixture_machine({"pci_devices": [["0x10de", "0x030200"]] * 4 + [["0x10de", "0x068000", "0x22a3"]] * nvswitches,
                               "secure_boot": False}, machine)
    link = cluster.base / f"pci-{host}"
    link.unlink(missing_ok=True)
    link.symlink_to(machine / "sys" / "bus" / "pci" / "devices")


def classic(ladder, venv: Path, cluster: RealSlurm) -> None:
    cluster.write_roots(configless=False)
    cluster.up()
    for host in NODES:
        cluster.fake_gpus(host)
    # gpu01 is an HGX node (4 NVSwitches), gpu02 a PCIe one: the health check finds that out itself (fabric_manager auto).
    pci_bus(cluster, "gpu01", nvswitches=4)
    pci_bus(cluster, "gpu02", nvswitches=0)
    site = cluster.site_slurm_conf()
    # Check mode on the controller and the GPU nodes (the login host takes the GPU nodes' path, see play 3), with DCGM
    # on and the driver loaded: DCGM is not installed in check mode, so there is no unit to start.
    result, records = play(cluster, venv, "1-classic-check-mode", "--check", "--diff", "-e", "gpu_health_dcgm=true",
                           "-e", f"gpu_health_driver_version_file={cluster.base / 'driver-gpu01'}", limit="slurmctl,gpu01,gpu02")
    ladder.check("real_slurm/classic, check mode (DCGM on, not installed yet): runs, writes nothing, restarts nothing",
                 result.returncode == 0 and all(conf_lines(cluster, h) == site.splitlines() for h in CLASSIC)
                 and all(conf_lines(cluster, h, SITE_INCLUDE_FILE) == cluster.site_include().splitlines() for h in CLASSIC)
                 and all(c["argv"][:1] == ["is-active"] for c in cluster.calls())
                 and not (cluster.root("gpu01") / "etc" / "slurm" / "gres.conf").exists(),
                 f"rc={result.returncode} calls={cluster.calls()}\n{lib.tail(result.stdout)}")

    limited_canary(ladder, venv, cluster, site)
    duplicate_nodename(ladder, venv, cluster)

    # gpu01's site gres.conf: a line for other nodes and a comment (kept), and a GPU line of its own (replaced by the role's).
    site_gres = ["# site: the Lustre bandwidth of the CPU nodes", "NodeName=cpu[01-02] Name=bandwidth Type=lustre Count=4G Flags=CountOnly"]
    (cluster.root("gpu01") / "etc" / "slurm" / "gres.conf").write_text("\n".join([*site_gres, "Name=gpu Type=a100 File=/dev/nvidia[0-1]", ""]))
    calls = len(cluster.calls())
    result, records = play(cluster, venv, "2-classic")
    ladder.check("real_slurm/classic: site.yml --tags slurm succeeds on the controller, both GPU nodes and the login host",
                 result.returncode == 0, f"{failures(records)}\n{lib.tail(result.stdout, 20)}")
    restarts = [(c["host"], c["argv"][1]) for c in cluster.calls()[calls:] if c["argv"][:1] == ["try-restart"]]
    ladder.check(f"real_slurm/classic: GPU nodes added (Slurm {cluster.slurm_version}: every slurmd must know every node): after "
                 "slurmctld, slurmd is restarted on every host of the play, the one that is not a GPU node too (login01 here, "
                 "a CPU node of slurm_gpu_node_conf_hosts alike)",
                 restarts[:1] == [("slurmctl", "slurmctld.service")]
                 and sorted(restarts[1:]) == [("gpu01", "slurmd.service"), ("gpu02", "slurmd.service"), ("login01", "slurmd.service")],
                 f"restarts={restarts}")
    gres = conf_lines(cluster, "gpu01", "gres.conf")
    ladder.check("real_slurm/classic: gres.conf is not rewritten whole: the site's lines for other nodes and its comment stay, "
                 "its GPU line for this node is replaced by the role's marked block",
                 gres[:2] == site_gres and "Name=gpu Type=h100 File=/dev/nvidia[0-3]" in gres and not any("a100" in line for line in gres)
                 and gres.count("# BEGIN hpc-train GPUs of this node") == 1 and gres[-1] == "# END hpc-train GPUs of this node",
                 json.dumps(gres))
    # The site keeps GresTypes and PropagateResourceLimits in its included file: the keys are set there, not appended to
    # slurm.conf after the Include (Slurm keeps a key's latest value: an appended GresTypes=gpu would drop bandwidth).
    wanted = {"PropagateResourceLimitsExcept=MEMLOCK", "Include hpc-train-gpu-nodes.conf", f"Include {SITE_INCLUDE}"}
    files = {h: conf_lines(cluster, h) + ["--- include"] + conf_lines(cluster, h, SITE_INCLUDE_FILE) for h in CLASSIC}
    ladder.check("real_slurm/classic: every host that reads a slurm.conf got the same keys (and the same files), each key in the "
                 "file the site set it in: GresTypes in its included file, MEMLOCK's exception in slurm.conf, "
                 "PropagateResourceLimits dropped from the included file",
                 all(wanted <= set(conf_lines(cluster, h)) and not any(line.lower().startswith("grestypes") for line in conf_lines(cluster, h))
                     and conf_lines(cluster, h, SITE_INCLUDE_FILE) == ["GresTypes=bandwidth,gpu"] for h in CLASSIC)
                 and len({tuple(lines) for lines in files.values()}) == 1, json.dumps({h: l[-8:] for h, l in files.items()}))
    nodes_files = {h: conf_lines(cluster, h, "hpc-train-gpu-nodes.conf") for h in CLASSIC}
    ladder.check("real_slurm/classic: the NodeName file is on every host, the same everywhere",
                 len({tuple(lines) for lines in nodes_files.values()}) == 1 and nodes_files["login01"], json.dumps(nodes_files))
    ladder.check("real_slurm/classic: the nodes' cgroup.conf keys set where the site set none, the site's own lines and its "
                 "ConstrainRAMSpace=no kept",
                 all(set(conf_lines(cluster, h, "cgroup.conf")) == {"CgroupPlugin=autodetect", "ConstrainCores=yes", "ConstrainDevices=yes",
                                                                     "ConstrainRAMSpace=no"} for h in NODES),
                 str({h: conf_lines(cluster, h, "cgroup.conf") for h in NODES}))
    nodes = start_slurm(cluster)
    config = cluster.in_host(cluster.controller, "scontrol", "show", "config").stdout
    said = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in config.splitlines()) if k.strip() in
            ("GresTypes", "PropagateResourceLimits", "PropagateResourceLimitsExcept")}
    ladder.check(f"real_slurm/classic: real slurmctld ({cluster.slurm_version}) reads the site's GresTypes with gpu added "
                 "(bandwidth kept) and MEMLOCK not propagated",
                 said == {"GresTypes": "bandwidth,gpu", "PropagateResourceLimits": "(null)", "PropagateResourceLimitsExcept": "MEMLOCK"},
                 json.dumps(said) + "\n" + cluster.logs(5))
    ladder.check("real_slurm/classic: real slurmd on gpu01 and on host gpu02 (NodeName gpu-b02) register with 4 GPUs, idle",
                 registered_with_gpus(nodes), json.dumps({n: {k: v.get(k) for k in ("State", "Gres", "Reason")} for n, v in nodes.items()})
                 + "\n" + cluster.logs())
    ladder.check("real_slurm/classic: slurmctld has gpu-b02 at host gpu02, gpu01 at its NodeAddr",
                 nodes.get("gpu-b02", {}).get("NodeHostName") == "gpu02" and nodes.get("gpu01", {}).get("NodeAddr") == "10.79.0.11",
                 json.dumps({n: {k: v.get(k) for k in ("NodeHostName", "NodeAddr")} for n, v in nodes.items()}))
    output = cluster.base / "job.out"
    job = cluster.sbatch_wait("login01", GPU_JOB, output)
    got = output.read_text().split() if output.exists() else []
    # slurmd's own limit: unlimited with the role's drop-in on a real node; here the machine's hard limit (no
    # CAP_SYS_RESOURCE), which is still not the submitting shell's 64 KiB.
    slurmd_limit = cluster.memlock_kib("gpu01")
    ladder.check("real_slurm/classic: a one-GPU job from the login host (shell MEMLOCK 64 KiB) gets a GPU and slurmd's locked-memory limit",
                 job.returncode == 0 and got == [slurmd_limit, "0"] and slurmd_limit != "64",
                 f"rc={job.returncode} job said {got}, slurmd has {slurmd_limit!r}\n{job.stdout}{job.stderr}")

    health(ladder, cluster)
    hung_nvidia_smi(ladder, cluster)

    # The site's own Slurm role puts the login host's slurm.conf back, and owns it (manage_slurm_conf false).
    (cluster.root("login01") / "etc" / "slurm" / "slurm.conf").write_text(site)
    (cluster.root("login01") / "etc" / "slurm" / SITE_INCLUDE_FILE).write_text(cluster.site_include())
    calls = len(cluster.calls())
    result, records = play(cluster, venv, "3-login-owned-by-the-site", "-e", "slurm_gpu_node_manage_slurm_conf=false", limit="login01")
    msg = failures(records).get("login01", "")
    ladder.check("real_slurm/classic: a login host whose slurm.conf lacks the keys is refused, naming the file it reads",
                 msg.startswith('slurm_gpu_node: Slurm on login01 reads /etc/slurm/slurm.conf: GresTypes is "bandwidth"')
                 and "PropagateResourceLimitsExcept=MEMLOCK" in msg and cluster.calls()[calls:] == [], msg or lib.tail(result.stdout))
    job = cluster.sbatch_wait("login01", GPU_JOB, output)
    ladder.check("real_slurm/classic: ... and from there, what the check is for: sbatch refuses GPU jobs (its GresTypes has no gpu)",
                 job.returncode != 0 and "gres" in job.stderr.lower(), f"rc={job.returncode} {job.stderr.strip()}")


def limited_canary(ladder, venv: Path, cluster: RealSlurm, site: str) -> None:
    """site.yml --limit gpu01,login01 before anything else ran (the documented canary, with a login host): the other
    GPU node has no facts, so no host can get the NodeName file. gpu01's slurm.conf runs the site's NHC."""
    include = cluster.root("gpu01") / "etc" / "slurm" / SITE_INCLUDE_FILE
    nhc = cluster.site_include() + "HealthCheckProgram=/usr/sbin/nhc\nHealthCheckInterval=600\n"
    include.write_text(nhc)  # the site runs NHC from its included file: slurm.conf itself does not name it
    result, records = play(cluster, venv, "1b-classic-limited", limit="gpu01,login01")
    msg = failures(records).get("gpu01", "")
    ladder.check("real_slurm/classic: a slurm.conf whose included file runs the site's own HealthCheckProgram (NHC) is refused, "
                 "naming that file, nothing changed",
                 msg.startswith(f"slurm_gpu_node: /etc/slurm/{SITE_INCLUDE_FILE} on gpu01 already runs HealthCheckProgram=/usr/sbin/nhc, "
                                "and slurmd runs only one; nothing was changed.") and "slurm_gpu_node_health_check_site_program=keep" in msg
                 and conf_lines(cluster, "gpu01") == site.splitlines() and include.read_text() == nhc, msg or lib.tail(result.stdout))
    ping = cluster.in_host("login01", "scontrol", "ping")
    lines = conf_lines(cluster, "login01")
    ladder.check("real_slurm/classic, --limit without the other GPU nodes: no Include of a NodeName file that is not there, so "
                 "Slurm's commands on the login host still read its slurm.conf",
                 not any(line.startswith("Include hpc-train") for line in lines)
                 and conf_lines(cluster, "login01", SITE_INCLUDE_FILE) == ["GresTypes=bandwidth,gpu"]
                 and "Unable to process configuration file" not in ping.stderr and "Slurmctld" in ping.stdout,
                 f"{lines[-6:]}\n{ping.stdout}{ping.stderr}")
    include.write_text(cluster.site_include())


def duplicate_nodename(ladder, venv: Path, cluster: RealSlurm) -> None:
    """A site whose included file already defines a GPU node (gpu02's NodeName gpu-b02): Slurm up to 23.11 ignores the
    later line (the roles' NodeName file, with its GPUs), and from 24.05 slurmctld refuses to start, cluster-wide."""
    include = cluster.root("gpu02") / "etc" / "slurm" / SITE_INCLUDE_FILE
    text = cluster.site_include() + "NodeName=gpu-b02 NodeHostName=gpu02 CPUs=2 State=UNKNOWN\n"
    include.write_text(text)
    slurm_conf = conf_lines(cluster, "gpu02")
    result, records = play(cluster, venv, "1c-classic-duplicate-nodename", limit="gpu02")
    msg = failures(records).get("gpu02", "")
    ladder.check("real_slurm/classic: a GPU node defined in a file slurm.conf includes is refused, naming that file, nothing changed",
                 msg.startswith(f"slurm_gpu_node: /etc/slurm/{SITE_INCLUDE_FILE} on gpu02 has NodeName lines of its own for gpu-b02;")
                 and "from 24.05 slurmctld refuses to start" in msg and include.read_text() == text and conf_lines(cluster, "gpu02") == slurm_conf,
                 msg or lib.tail(result.stdout))
    include.write_text(cluster.site_include())


def health(ladder, cluster: RealSlurm) -> None:
    """gpu_health's check, run by the real slurmd every 2 s (HealthCheckProgram), against each node's stand-in GPUs."""
    cluster.fake_gpus("gpu01", gpus=3)
    cluster.fake_gpus("gpu02", gpu_fields={"1": {"ecc.errors.uncorrected.volatile.total": "2"}})
    drained = lambda nodes, name: "DRAIN" in nodes.get(name, {}).get("State", "") and nodes[name].get("Reason", "").startswith("gpu_health:")  # noqa: E731
    nodes = cluster.wait("drains", lambda: (lambda n: drained(n, "gpu01") and drained(n, "gpu-b02") and n)(cluster.nodes()), 20) or cluster.nodes()
    ladder.check("real_slurm/gpu_health: slurmd's health check drains a node that lost a GPU (Slurm's Gres says 4, not the 8 "
                 "it was deployed with) and one with an ECC error, saying why",
                 nodes.get("gpu01", {}).get("Reason") == "gpu_health: 3 of 4 GPUs answer"
                 and nodes.get("gpu-b02", {}).get("Reason") == "gpu_health: GPU 1 has 2 uncorrected ECC error(s)",
                 json.dumps({n: {k: v.get(k) for k in ("State", "Reason")} for n, v in nodes.items()}) + "\n" + cluster.logs(5))
    cluster.fake_gpus("gpu01")
    nodes = cluster.wait_nodes(["gpu01"], timeout_s=20)
    ladder.check("real_slurm/gpu_health: once its GPUs are back the node it drained is resumed; the other stays drained",
                 nodes.get("gpu01", {}).get("State") == "IDLE" and drained(nodes, "gpu-b02"),
                 json.dumps({n: {k: v.get(k) for k in ("State", "Reason")} for n, v in nodes.items()}))
    cluster.in_host(cluster.controller, "scontrol", "update", "nodename=gpu01", "state=drain", "reason=bad fan")
    checked = cluster.wait_health_checks("gpu01", 2)
    nodes = cluster.nodes()
    ladder.check("real_slurm/gpu_health: a drain of someone else's on a healthy node is left alone (two checks later)",
                 checked and "DRAIN" in nodes.get("gpu01", {}).get("State", "") and nodes["gpu01"].get("Reason") == "bad fan",
                 f"checks ran: {checked}; " + json.dumps({k: nodes.get("gpu01", {}).get(k) for k in ("State", "Reason")}))
    xid_marker(ladder, cluster)
    # A node the driver role handed to Slurm's reboot (slurm_asap) comes back held with a DRAIN and the reboot's reason
    # (ReturnToService never clears a DRAIN): the check resumes it once healthy, as it would a DOWN one.
    reboot_reason = f"{lib.GPU_HEALTH_REBOOT_REASON} into NVIDIA driver 570.172.08"
    cluster.in_host(cluster.controller, "scontrol", "update", "nodename=gpu01", "state=drain", f"reason={reboot_reason}")
    nodes = cluster.wait_nodes(["gpu01"], timeout_s=15)
    ladder.check("real_slurm/gpu_health: a node back from a reboot handed to Slurm, held drained with the reboot's reason, is "
                 "resumed once healthy", nodes.get("gpu01", {}).get("State") == "IDLE",
                 json.dumps({k: nodes.get("gpu01", {}).get(k) for k in ("State", "Reason")}))
    cluster.fake_gpus("gpu02")
    for name in NODES.values():
        cluster.in_host(cluster.controller, "scontrol", "update", f"nodename={name}", "state=resume")
    rolling_upgrade(ladder, cluster)
    nvswitch_fabric(ladder, cluster)


def nvswitch_fabric(ladder, cluster: RealSlurm) -> None:
    """gpu01 has NVSwitches on its PCI bus, gpu02 none; both GPUs' fabric registration stuck (nvidia-fabricmanager not
    running: every CUDA call fails with error 802 while nvidia-smi answers as usual). Only the NVSwitch node is drained,
    and resumed once its fabric is up."""
    stuck = {"fabric": ["In Progress", "N/A"]}
    cluster.fake_gpus("gpu01", **stuck)
    cluster.fake_gpus("gpu02", **stuck)
    reason = "gpu_health: NVSwitch fabric not up on 4 GPU(s) (GPU 0: In Progress, N/A)"
    nodes = cluster.wait("fabric drain", lambda: (lambda n: n.get("gpu01", {}).get("Reason") == reason
                                                   and n.get("gpu-b02", {}).get("State") == "IDLE" and n)(cluster.nodes()), 20) \
        or cluster.nodes()
    ladder.check("real_slurm/gpu_health: a node with NVSwitches on its PCI bus (NVIDIA class 0x0680) whose GPU fabric is not up is "
                 "drained, not left in service into CUDA error 802; a PCIe node whose GPUs answer the same is left alone",
                 "DRAIN" in nodes.get("gpu01", {}).get("State", "") and nodes.get("gpu-b02", {}).get("State") == "IDLE",
                 json.dumps({n: {k: v.get(k) for k in ("State", "Reason")} for n, v in nodes.items()}))
    cluster.fake_gpus("gpu01")
    cluster.fake_gpus("gpu02")
    nodes = cluster.wait_nodes(["gpu01"], timeout_s=20)
    ladder.check("real_slurm/gpu_health: once the fabric is up (Completed, Success) the NVSwitch node is resumed",
                 nodes.get("gpu01", {}).get("State") == "IDLE", json.dumps({k: nodes.get("gpu01", {}).get(k) for k in ("State", "Reason")}))


def xid_marker(ladder, cluster: RealSlurm) -> None:
    """A node the check drained for an Xid (an admin must reset the GPU) that then fails another way: the Xid stays in
    its reason, so the node is not resumed once the other problem is gone. (The Xid itself comes from the kernel log,
    which this machine's GPUs never write: the drain the check gives it is set here.)"""
    xid = "gpu_health: Xid 79 in the kernel log"
    boot_id = cluster.root("gpu01") / BOOT_ID.lstrip("/")
    boot_id.write_text("boot-1\n")
    cluster.in_host(cluster.controller, "scontrol", "update", "nodename=gpu01", "state=drain", f"reason={xid}")
    cluster.fake_gpus("gpu01", gpus=3)
    both = "gpu_health: 3 of 4 GPUs answer; Xid 79 in the kernel log"
    nodes = cluster.wait("xid + lost GPU", lambda: (lambda n: n.get("gpu01", {}).get("Reason", "").startswith("gpu_health: 3 of 4") and n)(
        cluster.nodes()), 15) or cluster.nodes()
    reason = nodes.get("gpu01", {}).get("Reason")
    cluster.fake_gpus("gpu01")
    checked = cluster.wait_health_checks("gpu01", 2)  # two whole checks that saw it healthy again but for the Xid
    after = cluster.nodes().get("gpu01", {})
    ladder.check("real_slurm/gpu_health: a node drained for an Xid that then loses a GPU keeps the Xid in its reason, and is not "
                 "resumed once the GPU is back (the GPU needs an admin's reset; two checks later)",
                 checked and reason == both and "DRAIN" in after.get("State", "") and after.get("Reason") == both,
                 f"checks ran: {checked}; reason while a GPU was lost: {reason!r}; after: "
                 f"{json.dumps({k: after.get(k) for k in ('State', 'Reason')})}")
    # The admin reboots the node (the GPU reset an Xid needs; here a new boot id): resumed only after the diagnostics,
    # without DCGM every check of the script, so not while a GPU is still missing, and as soon as they pass.
    with cluster.health_checks_held("gpu01"):  # the reboot: new boot id, the GPUs as they came back; no check across it
        cluster.fake_gpus("gpu01", gpus=3)
        boot_id.write_text("boot-2\n")
    checked = cluster.wait_health_checks("gpu01", 2)  # two whole checks after the reboot, with a GPU still missing
    missing = cluster.nodes().get("gpu01", {})
    cluster.fake_gpus("gpu01")
    nodes = cluster.wait_nodes(["gpu01"], timeout_s=15)
    ladder.check("real_slurm/gpu_health: after a reboot, a node drained for an Xid is resumed only once the diagnostics pass "
                 "(every check, no DCGM here): kept drained while a GPU is missing (two checks), resumed when all answer",
                 checked and "DRAIN" in missing.get("State", "") and "Xid 79" in missing.get("Reason", "")
                 and nodes.get("gpu01", {}).get("State") == "IDLE",
                 f"checks ran: {checked}; with a GPU missing: {json.dumps({k: missing.get(k) for k in ('State', 'Reason')})}; after: "
                 f"{json.dumps({k: nodes.get('gpu01', {}).get(k) for k in ('State', 'Reason')})}")


def rolling_upgrade(ladder, cluster: RealSlurm) -> None:
    """A rolling driver upgrade (570 -> 575) half-way: gpu02's batch is done (nvidia_driver wrote the version it
    installed), gpu01's not; the check was rendered with the stack's old pin (570) and is rendered again only after the
    last batch. The upgraded node must not be drained by its own check for running the driver it was upgraded to."""
    installed = cluster.root("gpu02") / INSTALLED_DRIVER.lstrip("/")
    installed.write_text("575.51.03\n")
    cluster.fake_gpus("gpu02", driver="575.51.03")
    checked = cluster.wait_health_checks("gpu02", 2) and cluster.wait_health_checks("gpu01", 1)
    nodes = cluster.nodes()
    ladder.check("real_slurm/gpu_health: in a rolling upgrade, a node whose batch installed 575 runs it without being drained "
                 "by a check still rendered with the 570 pin; the node not yet upgraded stays in service on 570",
                 checked and nodes.get("gpu-b02", {}).get("State") == "IDLE" and nodes.get("gpu01", {}).get("State") == "IDLE",
                 f"checks ran: {checked}; " + json.dumps({n: {k: v.get(k) for k in ("State", "Reason")} for n, v in nodes.items()}))
    installed.unlink()
    cluster.fake_gpus("gpu02")
    cluster.in_host(cluster.controller, "scontrol", "update", "nodename=gpu-b02", "state=resume")
    # A check that read the 575 file before it went and the stand-in after it can still drain the node (its own
    # reason, which the next check clears): the next test starts from both nodes in service.
    cluster.wait_nodes(["gpu01", "gpu-b02"], timeout_s=20)


def hung_nvidia_smi(ladder, cluster: RealSlurm) -> None:
    """nvidia-smi that never returns (a GPU off the bus): real slurmd kills its HealthCheckProgram after 60 s, so the
    check must give up on nvidia-smi itself, drain, and not start a second one behind the first."""
    cluster.fake_gpus("gpu02", hang=True)
    want = f"gpu_health: nvidia-smi hung > {SMI_TIMEOUT_S} s"
    nodes = cluster.wait("hung drain", lambda: (lambda n: n.get("gpu-b02", {}).get("Reason") == want and n)(cluster.nodes()), 20) \
        or cluster.nodes()
    ladder.check("real_slurm/gpu_health: nvidia-smi that never returns (ignores SIGTERM): the node is drained within seconds, "
                 "not killed with its check by slurmd after 60 s",
                 "DRAIN" in nodes.get("gpu-b02", {}).get("State", "") and nodes["gpu-b02"].get("Reason") == want,
                 json.dumps({k: nodes.get("gpu-b02", {}).get(k) for k in ("State", "Reason")}) + "\n" + cluster.logs(5))
    time.sleep(5)  # two more checks
    hung = cluster.hung_smi_pids("gpu02")
    ladder.check("real_slurm/gpu_health: ... and the checks after it start no second nvidia-smi behind the hung one",
                 len(hung) == 1, f"hung stand-ins: {hung}")
    for pid in hung:
        os.kill(pid, signal.SIGKILL)
    cluster.fake_gpus("gpu02", warning="WARNING: infoROM is corrupted at gpu 0000:17:00.0")
    nodes = cluster.wait_nodes(["gpu-b02"], timeout_s=20)
    checked = cluster.wait_health_checks("gpu02", 2)  # and stays so
    nodes = cluster.nodes()
    ladder.check("real_slurm/gpu_health: once nvidia-smi answers again the node is resumed, and its warning on stderr (infoROM) "
                 "is not taken for a GPU (two checks later)", checked and nodes.get("gpu-b02", {}).get("State") == "IDLE",
                 json.dumps({k: nodes.get("gpu-b02", {}).get(k) for k in ("State", "Reason")}))
    cluster.fake_gpus("gpu02")


def configless(ladder, venv: Path, cluster: RealSlurm) -> None:
    cluster.write_roots(configless=True)
    cluster.up()
    result, records = play(cluster, venv, "4-configless-slurmd-not-started")
    msgs = failures(records)
    ladder.check("real_slurm/configless: nodes whose slurmd has fetched nothing are refused with the fix",
                 sorted(msgs) == ["gpu01", "gpu02"] and all(m.startswith(f"slurm_gpu_node: {h} is configless, but slurmd has fetched no "
                                                                         "configuration from slurmctld") and "--conf-server" in m
                                                              for h, m in msgs.items()), json.dumps(msgs))
    ctl = cluster.root("slurmctl") / "etc" / "slurm"
    node_files = sorted(str(p.relative_to(cluster.base)) for h in NODES for p in (cluster.root(h) / "etc" / "slurm").rglob("*"))
    ladder.check("real_slurm/configless: gres lines (NodeName-qualified, gpu-b02 too) and cgroup keys on the controller, nothing on the nodes",
                 (ctl / "gres.conf").exists() and "NodeName=gpu-b02 Name=gpu Type=h100 File=/dev/nvidia[0-3]" in (ctl / "gres.conf").read_text()
                 and "ConstrainDevices=yes" in (ctl / "cgroup.conf").read_text() and node_files == [], str(node_files))
    nodes = start_slurm(cluster)
    ladder.check("real_slurm/configless: slurmd --conf-server on both nodes registers them with the controller's gres.conf, idle",
                 registered_with_gpus(nodes), json.dumps({n: {k: v.get(k) for k in ("State", "Gres", "Reason")} for n, v in nodes.items()})
                 + "\n" + cluster.logs())
    said = cluster.in_host("gpu01", "scontrol", "show", "config").stdout
    slurm_conf = next((line.split("=", 1)[1].strip() for line in said.splitlines() if line.startswith("SLURM_CONF")), "")
    ladder.check("real_slurm/configless: scontrol on a configless node names slurmctld's SLURM_CONF, not the fetched copy "
                 "(so it cannot tell configless mode)", slurm_conf == "/etc/slurm/slurm.conf", slurm_conf)

    calls = len(cluster.calls())
    result, records = play(cluster, venv, "5-configless-rerun", "-e", "slurm_gpu_node_nodename_extra=Weight=5")
    restarts = [(c["host"], c["argv"][1]) for c in cluster.calls()[calls:] if c["argv"][:1] == ["try-restart"]]
    fetched = cluster.root("gpu01") / "run" / "slurm" / "conf" / "hpc-train-gpu-nodes.conf"
    ladder.check("real_slurm/configless: a rerun passes the checks of what each node fetched, and writes nothing on the nodes",
                 result.returncode == 0 and not any((cluster.root(h) / "etc" / "slurm" / "gres.conf").exists() for h in NODES),
                 f"{failures(records)}\n{lib.tail(result.stdout, 15)}")
    ladder.check("real_slurm/configless: a controller change restarts slurmctld, then each slurmd, which fetches the new NodeName lines",
                 restarts[:1] == [("slurmctl", "slurmctld.service")] and sorted(restarts[1:]) == [("gpu01", "slurmd.service"), ("gpu02", "slurmd.service")]
                 and fetched.exists() and "Weight=5" in fetched.read_text(), f"restarts={restarts}")
    nodes = cluster.wait_nodes(list(NODES.values()))
    ladder.check("real_slurm/configless: after the restarts both nodes are back, idle, with the new weight",
                 registered_with_gpus(nodes) and all(nodes[n].get("Weight") == "5" for n in NODES.values()),
                 json.dumps({n: {k: v.get(k) for k in ("State", "Weight")} for n, v in nodes.items()}))
