"""The local Slurm cluster is a real multi-node cluster with the shape the other Slurm tests rely on.

Each job costs seconds, so assertions are merged into few jobs. Measured times are printed
(``pytest -s`` or ``-rA`` shows them).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster import harness
from tests.cluster.harness import ClusterInfo


def _slurm(
    cluster: ClusterInfo, *args: str, check: bool = True, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return harness.run_slurm(list(args), env=cluster.env, check=check, timeout_s=timeout_s)


def _wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen within {timeout_s:.0f} s")
        time.sleep(poll_s)


def test_shape_nodes_partitions_gres_accounting(slurm_cluster: ClusterInfo) -> None:
    c = slurm_cluster
    assert c.nodes == ["gpu01", "gpu02"]
    assert c.nodelist == "gpu[01-02]"
    assert (c.partition, c.account, c.cluster) == ("gpu", "research", "hpctrain")

    rows = _slurm(c, "sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G|%t").stdout.split()
    seen = {tuple(r.split("|")[:2]): r.split("|")[2:] for r in rows}
    assert set(seen) == {(n, p) for n in c.nodes for p in ("gpu*", "debug")}, rows
    for cpus, mem, gres, state in seen.values():
        assert (int(cpus), int(mem), gres) == (8, c.mem_per_node_mb, "gpu:4")
        assert state in {"idle", "mix", "alloc"}, rows

    config = _slurm(c, "scontrol", "show", "config").stdout
    for key, value in {
        "ClusterName": "hpctrain",
        "KillWait": "5 sec",
        "JobRequeue": "1",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "GresTypes": "gpu",
        "AccountingStorageType": "accounting_storage/slurmdbd",
    }.items():
        assert re.search(rf"^{key}\s*=\s*{re.escape(value)}\s*$", config, re.M), f"{key} != {value}"
    assert f"cred_expire={c.cred_expire_s}" in config

    assocs = _slurm(c, "sacctmgr", "-n", "-P", "show", "assoc", "format=cluster,account,user").stdout.split()
    assert "hpctrain|research|root" in assocs


def test_srun_spans_two_namespaced_nodes(slurm_cluster: ClusterInfo) -> None:
    c = slurm_cluster
    task = (
        'echo "$SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID $(hostname) $SLURMD_NODENAME '
        '$(hostname -I | tr -d " ") $(getent hosts gpu01 gpu02 | cut -d" " -f1 | paste -sd, -)"'
    )
    t0 = time.monotonic()
    out = _slurm(c, "srun", "-N2", "--ntasks-per-node=2", f"--account={c.account}", "sh", "-c", task).stdout
    print(f"srun -N2 --ntasks-per-node=2: {time.monotonic() - t0:.2f} s")

    tasks = sorted(line.split() for line in out.splitlines() if line.strip())
    assert len(tasks) == 4, out
    ips = f"{c.node_ips['gpu01']},{c.node_ips['gpu02']}"
    expected = [
        ["0", "0", "0", "gpu01", "gpu01", c.node_ips["gpu01"], ips],
        ["1", "0", "1", "gpu01", "gpu01", c.node_ips["gpu01"], ips],
        ["2", "1", "0", "gpu02", "gpu02", c.node_ips["gpu02"], ips],
        ["3", "1", "1", "gpu02", "gpu02", c.node_ips["gpu02"], ips],
    ]
    assert tasks == expected, out  # PROCID NODEID LOCALID hostname SLURMD_NODENAME own-IP resolved-IPs
    assert c.node_ips["gpu01"] != c.node_ips["gpu02"]


def test_fake_gpus_schedule_and_jobs_are_accounted(slurm_cluster: ClusterInfo, tmp_path: Path) -> None:
    c = slurm_cluster
    script = tmp_path / "gpus.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "batch $(hostname) JOB_GPUS=$SLURM_JOB_GPUS"\n'
        'srun --ntasks-per-node=1 sh -c \'echo "task $(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\'\n'
    )
    # Both fit at once (2 + 2 of the 4 GPUs on a node), so they run side by side.
    per_node = harness.sbatch(
        ["-N2", "--gpus-per-node=2", "--mem=2G", f"--account={c.account}"]
        + ["-o", str(tmp_path / "per-node.out"), str(script)],
        env=c.env,
    )
    gres = harness.sbatch(
        ["-N1", "-p", "debug", "--gres=gpu:2", "-o", str(tmp_path / "gres.out"), str(script)], env=c.env
    )
    t0 = time.monotonic()
    assert harness.wait_job(per_node, timeout_s=60, env=c.env) == "COMPLETED"
    assert harness.wait_job(gres, timeout_s=60, env=c.env) == "COMPLETED"
    print(f"two GPU jobs: submit to both COMPLETED {time.monotonic() - t0:.2f} s")

    def visible(out: str) -> dict[str, list[str]]:
        found = re.findall(r"^task (\S+) CUDA_VISIBLE_DEVICES=(\S*)$", out, re.M)
        return {host: devs.split(",") for host, devs in found}

    out = (tmp_path / "per-node.out").read_text()
    seen = visible(out)
    assert sorted(seen) == ["gpu01", "gpu02"], out
    assert all(len(devs) == 2 for devs in seen.values()), out
    out = (tmp_path / "gres.out").read_text()
    seen = visible(out)
    assert len(seen) == 1 and len(next(iter(seen.values()))) == 2, out

    # sacct (slurmdbd + mariadb) has both jobs, finished, with their account, partition and GPUs.
    assert harness.wait_sacct(per_node, env=c.env) == "COMPLETED"
    assert harness.wait_sacct(gres, env=c.env) == "COMPLETED"
    fields = "JobID,State,Account,Partition,AllocTRES"
    rows = _slurm(c, "sacct", "-n", "-X", "-P", "-j", f"{per_node},{gres}", "-o", fields).stdout
    records = {r.split("|")[0]: r.split("|")[1:] for r in rows.split()}
    assert records[per_node][:3] == ["COMPLETED", "research", "gpu"], rows
    assert "gres/gpu=4" in records[per_node][3], rows
    assert records[gres][:3] == ["COMPLETED", "research", "debug"], rows
    assert "gres/gpu=2" in records[gres][3], rows


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        (["--gpus-per-node=5"], "Requested node configuration is not available"),
        (["--gres=gpu:5"], "Requested node configuration is not available"),
        (["--account=no-such-account"], "Invalid account or account/partition combination specified"),
        (["--partition=no-such-partition"], "invalid partition specified: no-such-partition"),
        (["-N3"], "Node count specification invalid"),
        (["--partition=debug", "--time=02:00:00"], "Requested time limit is invalid"),
        (["--mem=64G"], "Memory specification can not be satisfied"),
    ],
    ids=["gpus-per-node", "gres", "account", "partition", "nodes", "time", "mem"],
)
def test_impossible_requests_are_rejected_at_submit(
    slurm_cluster: ClusterInfo, request_args: list[str], message: str
) -> None:
    proc = _slurm(slurm_cluster, "sbatch", "--parsable", *request_args, "--wrap", "true", check=False)
    assert proc.returncode != 0, f"accepted as job {proc.stdout.strip()}"
    assert message in proc.stderr


def test_requeue_runs_the_job_again_with_restart_count(slurm_cluster: ClusterInfo, tmp_path: Path) -> None:
    c = slurm_cluster
    out_file = tmp_path / "requeue.out"
    script = tmp_path / "requeue.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "run restart=${SLURM_RESTART_COUNT:-0} host=$(hostname)"\n'
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then srun --ntasks-per-node=1 sleep 300; fi\n'
        'srun --ntasks-per-node=1 sh -c \'echo "step restart=$SLURM_RESTART_COUNT node=$(hostname)"\'\n'
    )
    job = harness.sbatch(["-N2", "--requeue", "--open-mode=append", "-o", str(out_file), str(script)], env=c.env)

    def output() -> str:
        return out_file.read_text() if out_file.exists() else ""

    _wait_for(lambda: "run restart=0" in output() and harness.job_state(job, c.env) == "RUNNING", 60, "first run")
    time.sleep(1)  # let the step start too: a requeue then has a multi-node step to kill (KillWait=5)
    t0 = time.monotonic()
    _slurm(c, "scontrol", "requeue", job)
    _wait_for(lambda: "run restart=1" in output(), c.cred_expire_s + 30, "the requeued run")
    delay = time.monotonic() - t0
    print(f"scontrol requeue -> running again: {delay:.1f} s (held cred_expire+1 = {c.cred_expire_s + 1} s)")

    assert harness.wait_job(job, timeout_s=60, env=c.env) == "COMPLETED"
    out = output()
    assert out.count("run restart=") == 2, out
    assert sorted(re.findall(r"^step restart=(\d+) node=(\S+)$", out, re.M)) == [("1", "gpu01"), ("1", "gpu02")], out
    # Slurm's own hold, not a release by this test, started it again: bounded by cred_expire.
    assert delay < c.cred_expire_s + 15

    assert harness.wait_sacct(job, env=c.env) == "COMPLETED"
    history = _slurm(c, "sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "State").stdout.split()
    assert history == ["REQUEUED", "COMPLETED"], history


@pytest.mark.parametrize("ours", [False, True], ids=["whole-machine", "ours"])
def test_check_clean_reports_a_running_cluster(slurm_cluster: ClusterInfo, ours: bool) -> None:
    # The post-run check must be able to fail: with the cluster up it lists the daemons, the node
    # namespaces and the bridge. (After slurm-down it must pass: the session fixture checks that
    # when it stopped the cluster, and CI runs it after `make slurm-down`.)
    clean, report = harness.check_clean(ours=ours)
    assert not clean, report
    for leftover in (
        "(slurmctld)",
        "(slurmd)",
        "(slurmdbd)",
        "(munged)",
        "(mariadbd)",
        "network namespace hpctrain-gpu01",
        "link br-hpctrain",
        "link veth-gpu02",
    ):
        assert leftover in report, report
