"""The real_slurm_newer rung: a site's Include files (issue 29, item 1) on a real Slurm 24.11, where a duplicate NodeName
is fatal to slurmctld. The same cluster as real_slurm (real_slurm/: a controller and GPU nodes gpu01 and gpu02, Slurm
NodeName gpu-b02, each in its own namespaces with its own /etc/slurm, /run and /dev), its daemons and commands Debian
trixie's Slurm 24.11 from tests/cluster's chroot (tests/cluster/slurm-chroot 24.11, built here when it is not cached):
each host enters the chroot with its own files (real_slurm/harness.write_chroot_commands). Classic mode; every host's
slurm.conf includes the site's file (Include site-%c.conf).

(b) the site's included file defines gpu02's NodeName: the roles refuse the controller and gpu02, naming that file,
    change nothing, and real slurmctld 24.11 starts on what they left
(c) without that line, site.yml --tags slurm,health: real slurmctld 24.11 starts, reports GresTypes=bandwidth,gpu (the
    site's key, kept in its included file), both nodes register with 4 GPUs, a GPU job runs, the health check (run
    by slurmd 24.11, asking scontrol 24.11) drains a node that lost a GPU and resumes it
(a) the stand-in check that the hazard is real, no roles involved: the site's NodeName line back in its included file
    beside the roles' NodeName file (the same template at 577edea as now) and real slurmctld 24.11 does not start,
    with its fatal line in the log

The Python suites' cluster (tests/cluster) is stopped first: never two clusters at once on one machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import ladder_lib as lib
from real_slurm.harness import SITE_INCLUDE_FILE, RealSlurm, write_chroot_commands
import rungs_slurm
from rungs_slurm import NODES, conf_lines, failures, pci_bus, play, registered_with_gpus, start_slurm

# 24.11 in the ladder (one newer release keeps pipeline D within pipeline A's time); 26.05, whose chroot
# tests/cluster also builds, by hand: HPC_TRAIN_REAL_SLURM_NEWER=26.05 bash run.sh --only real_slurm_newer.
VERSION = os.environ.get("HPC_TRAIN_REAL_SLURM_NEWER", "24.11")
HOSTS = {"slurmctl": "controller", "gpu01": "node", "gpu02": "node"}
# The site's own line for gpu02's node, in its included file: what the roles must not define a second time.
SITE_NODE_LINE = "NodeName=gpu-b02 NodeHostName=gpu02 CPUs=2 State=UNKNOWN"
NODES_FILE = "hpc-train-gpu-nodes.conf"
GPU_JOB = "sbatch --wait --quiet -N1 --gpus=1 -o OUTPUT --wrap 'echo \"$CUDA_VISIBLE_DEVICES\"'"


def real_slurm_newer(ladder, venv: Path) -> None:
    built = subprocess.run([str(lib.REPO / "tests" / "cluster" / "slurm-chroot"), VERSION], capture_output=True, text=True)
    chroot = Path(built.stdout.strip())
    if not ladder.check(f"real_slurm_newer/Slurm {VERSION}'s chroot is built or cached (tests/cluster/slurm-chroot {VERSION})",
                        built.returncode == 0 and (chroot / "usr" / "sbin" / "slurmctld").exists(), lib.tail(built.stderr)):
        return
    down = subprocess.run([str(lib.REPO / "tests" / "cluster" / "slurm-down")], capture_output=True, text=True)
    if not ladder.check("real_slurm_newer/the Python suites' cluster is stopped first (one cluster at a time)", down.returncode == 0,
                        down.stdout + down.stderr):
        return
    base = lib.WORK / f"real-slurm-{VERSION}"
    base.mkdir(parents=True, exist_ok=True)
    cluster = RealSlurm(base, venv / "bin" / "python", HOSTS, slurm_bin=write_chroot_commands(chroot, base / "bin" / f"slurm-{VERSION}"))
    try:
        if ladder.check(f"real_slurm_newer/the cluster runs Slurm {VERSION} from the chroot", cluster.slurm_version.startswith(VERSION),
                        cluster.slurm_version):
            include_files(ladder, venv, cluster)
    finally:
        rungs_slurm.stop_and_check_clean(ladder, cluster, base, "real_slurm_newer")


def include_files(ladder, venv: Path, cluster: RealSlurm) -> None:
    shutil.rmtree(cluster.base / "log", ignore_errors=True)  # no earlier run's slurmctld.log (its fatal line)
    cluster.write_roots(configless=False)
    cluster.up()
    for host in NODES:
        cluster.fake_gpus(host)
        pci_bus(cluster, host, nvswitches=0)
    refused_duplicate(ladder, venv, cluster)
    site_keys_kept(ladder, venv, cluster)
    fatal_duplicate(ladder, cluster)


def site_files(cluster: RealSlurm) -> dict[str, list[list[str]]]:
    """What Slurm reads of the site's configuration on each host: its slurm.conf and the file that includes."""
    return {h: [conf_lines(cluster, h), conf_lines(cluster, h, SITE_INCLUDE_FILE)] for h in cluster.hosts}


def refused_duplicate(ladder, venv: Path, cluster: RealSlurm) -> None:
    """(b) The site defines gpu02's node in its included file, on every host (one configuration cluster-wide). The GPU
    nodes' play runs before the controller's, so their gres.conf and cgroup.conf are written before the controller
    refuses, and the controller's NodeName file is written just before its refusal: Slurm reads none of these while
    slurm.conf includes no NodeName file. What is checked is what Slurm reads, and that no daemon was restarted."""
    for host in cluster.hosts:
        (cluster.root(host) / "etc" / "slurm" / SITE_INCLUDE_FILE).write_text(cluster.site_include() + SITE_NODE_LINE + "\n")
    before = site_files(cluster)
    calls = len(cluster.calls())
    result, records = play(cluster, venv, f"{VERSION}-1-duplicate-nodename")
    msgs = failures(records)
    refusal = f"slurm_gpu_node: /etc/slurm/{SITE_INCLUDE_FILE} on slurmctl has NodeName lines of its own for gpu-b02;"
    restarts = [c for c in cluster.calls()[calls:] if c["argv"][0] not in ("is-active", "daemon-reload")]
    ok = result.returncode != 0 and msgs.get("slurmctl", "").startswith(refusal) and not restarts
    # What slurmctld makes of the files as the play left them: with the refusal, the site's own (it starts).
    cluster.systemctl(cluster.controller, "start", "slurmctld.service")
    up = cluster.wait("slurmctld", cluster.controller_up, 20)
    ladder.check(f"real_slurm_newer/a GPU node the site's included file defines is refused on the controller, naming the file: "
                 f"slurm.conf and the included file unchanged on every host, no daemon restarted; real slurmctld "
                 f"{cluster.slurm_version} starts on what is left", ok and site_files(cluster) == before and up,
                 f"slurmctld up: {up}; restarts: {restarts}; changed: {[h for h in before if site_files(cluster)[h] != before[h]]}; refusals: "
                 f"{json.dumps(msgs)}\n{lib.tail(result.stdout, 8)}\n{slurmctld_fatal(cluster) or cluster.logs(4)}")
    cluster.systemctl(cluster.controller, "stop", "slurmctld.service")
    for host in cluster.hosts:
        (cluster.root(host) / "etc" / "slurm" / SITE_INCLUDE_FILE).write_text(cluster.site_include())


def site_keys_kept(ladder, venv: Path, cluster: RealSlurm) -> None:
    """(c) The same site without the duplicate: the play, then the real 24.11 daemons on what it wrote."""
    result, records = play(cluster, venv, f"{VERSION}-2-classic")
    ladder.check(f"real_slurm_newer/site.yml --tags slurm,health succeeds on the controller and both GPU nodes (Slurm {cluster.slurm_version})",
                 result.returncode == 0, f"{failures(records)}\n{lib.tail(result.stdout, 20)}")
    nodes = start_slurm(cluster)
    config = cluster.in_host(cluster.controller, "scontrol", "show", "config").stdout
    gres_types = next((v.strip() for k, _, v in (line.partition("=") for line in config.splitlines()) if k.strip() == "GresTypes"), "")
    ladder.check(f"real_slurm_newer/real slurmctld {cluster.slurm_version} starts and reports GresTypes=bandwidth,gpu: the site's key, "
                 "set in its included file",
                 gres_types == "bandwidth,gpu" and all(conf_lines(cluster, h, SITE_INCLUDE_FILE) == ["GresTypes=bandwidth,gpu"] for h in cluster.hosts),
                 f"GresTypes={gres_types!r}; included files: {json.dumps({h: conf_lines(cluster, h, SITE_INCLUDE_FILE) for h in cluster.hosts})}"
                 f"\n{cluster.logs(5)}")
    ladder.check(f"real_slurm_newer/real slurmd {cluster.slurm_version} on gpu01 and on host gpu02 (NodeName gpu-b02) register with "
                 "4 GPUs, idle", registered_with_gpus(nodes),
                 json.dumps({n: {k: v.get(k) for k in ("State", "Gres", "Reason")} for n, v in nodes.items()}) + "\n" + cluster.logs())
    output = cluster.base / "job.out"
    job = cluster.sbatch_wait(cluster.controller, GPU_JOB, output)
    got = output.read_text().split() if output.exists() else []
    ladder.check("real_slurm_newer/a one-GPU job runs and gets one GPU", job.returncode == 0 and got == ["0"],
                 f"rc={job.returncode} job said {got}\n{job.stdout}{job.stderr}")
    # The health check (slurmd's HealthCheckProgram, inside the chroot) reads 24.11's scontrol output.
    cluster.fake_gpus("gpu01", gpus=3)
    drained = cluster.wait("drain", lambda: cluster.nodes().get("gpu01", {}).get("Reason") == "gpu_health: 3 of 4 GPUs answer", 20)
    cluster.fake_gpus("gpu01")
    nodes = cluster.wait_nodes(["gpu01"], timeout_s=20)
    ladder.check(f"real_slurm_newer/slurmd {cluster.slurm_version}'s health check drains a node that lost a GPU, saying why, and "
                 "resumes it once its GPUs are back", drained and nodes.get("gpu01", {}).get("State") == "IDLE",
                 f"drained: {drained}; " + json.dumps({k: nodes.get("gpu01", {}).get(k) for k in ("State", "Reason")}) + "\n" + cluster.logs(5))


def slurmctld_fatal(cluster: RealSlurm) -> str:
    log = cluster.base / "log" / "slurmctld.log"
    return next((line for line in (log.read_text(errors="replace").splitlines() if log.exists() else []) if "fatal" in line), "")


def fatal_duplicate(ladder, cluster: RealSlurm) -> None:
    """(a) The stand-in check, no roles involved: the files the roles of 577edea would have left for the site of (b) —
    which did not read Include files and wrote the NodeName file of the same template as today's (the one (c) wrote
    here) — are the site's NodeName line back in its included file beside the roles' NodeName file."""
    ctl = cluster.root(cluster.controller) / "etc" / "slurm"
    cluster.systemctl(cluster.controller, "stop", "slurmctld.service")
    (cluster.base / "log" / "slurmctld.log").unlink(missing_ok=True)
    (ctl / SITE_INCLUDE_FILE).write_text((ctl / SITE_INCLUDE_FILE).read_text() + SITE_NODE_LINE + "\n")
    roles_line = next((line for line in conf_lines(cluster, cluster.controller, NODES_FILE) if line.startswith("NodeName=gpu-b02 ")), "")
    cluster.systemctl(cluster.controller, "start", "slurmctld.service")
    # Until its fatal line is logged and the process has gone (is-active alone says "inactive" while the wrapper still
    # enters the chroot, before slurmctld runs at all).
    exited = cluster.wait("slurmctld's fatal exit", lambda: slurmctld_fatal(cluster) and cluster.systemctl(
        cluster.controller, "is-active", "slurmctld.service").returncode != 0, 30)
    fatal = re.sub(r"^\[[^]]*\] ", "", slurmctld_fatal(cluster).strip())  # without its time stamp: the check's name stays the same
    ladder.check(f"real_slurm_newer/stand-in check: the site's NodeName line for gpu-b02 in its included file beside the roles' "
                 f"{NODES_FILE} (the 577edea roles' result) and real slurmctld {cluster.slurm_version} does not start: {fatal!r}",
                 bool(roles_line) and exited and re.match(r"fatal: .*gpu-b02", fatal) is not None,
                 f"roles' line: {roles_line!r}; exited: {exited}\n{cluster.logs(6)}")
