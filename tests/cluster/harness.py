"""Python side of the local Slurm test cluster (stdlib only).

The cluster itself is started and stopped by the shell scripts next to this file
(``slurm-up``, ``slurm-down``; ``make slurm-up`` / ``make slurm-down`` call them). This module runs
them, reads the cluster's shape from ``<state dir>/cluster.json`` (written by ``slurm-up``) and
offers the few helpers every Slurm test needs::

    from tests.cluster import harness
    info = harness.start_cluster()              # idempotent; info.started says if this call started it
    job = harness.sbatch(["-N2", "--wrap", "srun hostname"], env=info.env)
    assert harness.wait_job(job, timeout_s=60) == "COMPLETED"

Cluster shape (tests rely on it): cluster ``hpctrain``, nodes ``gpu01``/``gpu02`` (``gpu[01-02]``),
each with 8 CPUs, 4 fake GPUs (``gres/gpu``) and 16000 MB; partitions ``gpu`` (default, 2 days) and
``debug`` (1 hour); account ``research`` (root's default); unknown accounts and impossible requests
are rejected at submit time (``AccountingStorageEnforce=associations``, ``EnforcePartLimits=ALL``).
A requeued job is held ``cred_expire + 1`` s (``AuthInfo=cred_expire=5``, so about 6 s, instead of
Slurm's 120 s) and then starts again by itself: no release step is needed.

Slurm version: ``HPCTRAIN_SLURM_VERSION`` (22.05, the host's packages, by default; 24.11 and 26.05 run from
a chroot, tests/cluster/versions.sh). ``ClusterInfo.slurm_version`` says which one is up; ``cluster_env()``
puts that version's client commands first on PATH (for 24.11 / 26.05 wrappers that enter the chroot), and
``ClusterInfo.python`` runs Python, hence hpc-train, where that version's jobs run (``job_python`` is the
interpreter's path as a job sees it: the command to give ``submit -- CMD``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parent
REPO_ROOT = HARNESS_DIR.parents[1]
SLURM_UP = HARNESS_DIR / "slurm-up"
SLURM_DOWN = HARNESS_DIR / "slurm-down"
CHECK_CLEAN = HARNESS_DIR / "check-clean"

ROOT_REASON = "the local Slurm cluster needs root (namespaces, mknod, daemons)"
DEFAULT_SLURM_VERSION = "22.05"

# Job states after which a job will not run again by itself (squeue -o %T / sacct State names).
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)

# Inherited variables that would change what the client commands do (a surrounding allocation's
# SLURM_JOB_ID makes srun run inside it; SQUEUE_FORMAT changes squeue's output, ...).
_CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SACCT_", "SCONTROL_")

_DAEMON_LOGS = ("slurmctld.log", "slurmd-gpu01.log", "slurmd-gpu02.log", "slurmdbd.log", "mariadb.log", "munged.log")


class ClusterError(RuntimeError):
    """The local cluster could not be started or stopped; the message carries the evidence."""


def state_dir() -> Path:
    """Where the cluster keeps its configs, logs and state (``HPCTRAIN_SLURM_DIR`` or <repo>/.slurm)."""
    return Path(os.environ.get("HPCTRAIN_SLURM_DIR") or REPO_ROOT / ".slurm")


def slurm_conf() -> Path:
    return state_dir() / "etc" / "slurm.conf"


def requested_version() -> str:
    """The Slurm version a start asks for: ``HPCTRAIN_SLURM_VERSION``, else 22.05 (slurm-up's default)."""
    return os.environ.get("HPCTRAIN_SLURM_VERSION") or DEFAULT_SLURM_VERSION


def client_bin() -> str | None:
    """The running cluster's wrapper directory (24.11 / 26.05: its commands enter the chroot); None on 22.05."""
    try:
        return json.loads((state_dir() / "cluster.json").read_text()).get("client_bin")
    except (OSError, ValueError):
        return None


def cluster_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` (or ``base``) for Slurm client commands: ``SLURM_CONF`` set, stray Slurm variables removed,
    the running version's client commands first on PATH."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(_CLIENT_ENV_PREFIXES)
    }
    env["SLURM_CONF"] = str(slurm_conf())
    wrappers = client_bin()
    if wrappers and not env.get("PATH", "").startswith(wrappers + os.pathsep):
        env["PATH"] = os.pathsep.join([wrappers, env.get("PATH", os.defpath)])
    return env


@dataclass(frozen=True)
class ClusterInfo:
    """The running cluster, as ``slurm-up`` describes it in ``cluster.json``."""

    nodes: list[str]  # ['gpu01', 'gpu02']
    nodelist: str  # 'gpu[01-02]'
    node_ips: dict[str, str]  # {'gpu01': '10.77.0.11', ...}
    cpus_per_node: int
    gpus_per_node: int
    mem_per_node_mb: int
    partition: str  # the default partition, 'gpu'
    partitions: list[str]  # ['gpu', 'debug']
    account: str  # 'research'
    cluster: str  # 'hpctrain'
    controller_host: str
    controller_ip: str
    cred_expire_s: int  # a requeued job is held this + 1 s
    slurm_conf: str
    state_dir: str
    env: dict[str, str]  # cluster_env(): use it for every client command
    started: bool  # True when this start_cluster() call started it from nothing (False: one was up)
    slurm_version: str = DEFAULT_SLURM_VERSION  # '22.05', '24.11' or '26.05'
    python: str = sys.executable  # runs Python (and `-m hpc_train.cli`) where this version's jobs run
    job_python: str = sys.executable  # that interpreter's path as a job sees it

    @property
    def in_chroot(self) -> bool:
        """Daemons, clients and jobs run in a chroot of a newer Debian (not the host's 22.05)."""
        return self.python != sys.executable


def read_cluster_info(started: bool = False) -> ClusterInfo:
    data = json.loads((state_dir() / "cluster.json").read_text())
    wrappers = data.get("client_bin")
    return ClusterInfo(
        nodes=list(data["nodes"]),
        nodelist=data["nodelist"],
        node_ips=dict(data["node_ips"]),
        cpus_per_node=int(data["cpus_per_node"]),
        gpus_per_node=int(data["gpus_per_node"]),
        mem_per_node_mb=int(data["mem_per_node_mb"]),
        partition=data["partition"],
        partitions=list(data["partitions"]),
        account=data["account"],
        cluster=data["cluster"],
        controller_host=data["controller"]["host"],
        controller_ip=data["controller"]["ip"],
        cred_expire_s=int(data["cred_expire_s"]),
        slurm_conf=data["slurm_conf"],
        state_dir=data["state_dir"],
        env=cluster_env(),
        started=started,
        slurm_version=data.get("slurm_version", DEFAULT_SLURM_VERSION),
        python=f"{wrappers}/python" if wrappers else sys.executable,
        job_python=data.get("job_python") or sys.executable,
    )


def daemon_log_tails(lines: int = 20, since: float | None = None) -> str:
    """The last ``lines`` of each daemon log (only those written after ``since``, when given)."""
    out = []
    for name in _DAEMON_LOGS:
        path = state_dir() / "log" / name
        try:
            if since is not None and path.stat().st_mtime < since:
                continue
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        out.append(f"---- {path}\n" + "\n".join(tail))
    return "\n".join(out)


def _run_script(script: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(script)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise ClusterError(f"{script.name} did not finish within {timeout_s:.0f} s\n{out[-3000:]}") from exc


def start_cluster(timeout_s: float | None = None) -> ClusterInfo:
    """Run ``slurm-up`` for :func:`requested_version` (installs packages on first use; about 2 s warm, well
    under a second when up; 24.11 / 26.05 build their chroot first when it is not cached: minutes).

    Raises ``PermissionError`` when not root and ``ClusterError`` (with the script's output and the
    tails of the daemon logs) when the cluster does not come up.
    """
    if os.geteuid() != 0:
        raise PermissionError(ROOT_REASON)
    t0 = time.time()
    if timeout_s is None:
        timeout_s = 300.0 if requested_version() == DEFAULT_SLURM_VERSION else 1500.0
    proc = _run_script(SLURM_UP, timeout_s)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        message = f"tests/cluster/slurm-up failed (exit {proc.returncode}):\n{output[-6000:]}"
        if "Log tails:" not in output:  # slurm-up prints them itself when it got that far
            message += f"\ndaemon logs:\n{daemon_log_tails(since=t0 - 1) or '(none written)'}"
        raise ClusterError(message)
    # "restarted": a cluster was there (e.g. a developer's, with an older harness): not ours to stop
    started = "STATUS=started" in proc.stdout.splitlines()
    return read_cluster_info(started=started)


def stop_cluster(timeout_s: float = 120.0) -> str:
    """Run ``slurm-down``; returns its output. Safe when nothing runs."""
    if os.geteuid() != 0:
        raise PermissionError(ROOT_REASON)
    proc = _run_script(SLURM_DOWN, timeout_s)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise ClusterError(f"tests/cluster/slurm-down failed (exit {proc.returncode}):\n{output[-4000:]}")
    return output


def check_clean(ours: bool = False) -> tuple[bool, str]:
    """Run ``check-clean``: (True, report) when no Slurm/munge/mariadb process, netns, veth or bridge is left.

    ``ours=True`` looks only for what this cluster started (a developer's own MariaDB is no leftover).
    """
    args = [str(CHECK_CLEAN), "--ours"] if ours else [str(CHECK_CLEAN)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
    return proc.returncode == 0, proc.stdout + proc.stderr


# ---- client helpers ----


def run_slurm(
    args: list[str], env: dict[str, str] | None = None, check: bool = True, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command with ``cluster_env()``; ``check`` raises with Slurm's stderr in the message."""
    proc = subprocess.run(
        args,
        env=cluster_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, args, proc.stdout, proc.stderr)
    return proc


def sbatch(args: list[str], env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable ARGS``; returns the job id."""
    proc = run_slurm(["sbatch", "--parsable", *args], env=env)
    return proc.stdout.strip().split(";")[0]


def job_state(job_id: str, env: dict[str, str] | None = None) -> str | None:
    """The job's state from squeue (any state while slurmctld still holds it), else None."""
    proc = run_slurm(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"], env=env, check=False)
    states = [s for s in proc.stdout.split() if s]
    if proc.returncode != 0 or not states:
        return None
    return _merge_states(states)


def sacct_state(job_id: str, env: dict[str, str] | None = None) -> str | None:
    """The job's state from accounting (``CANCELLED by 0`` -> ``CANCELLED``), else None."""
    proc = run_slurm(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], env=env, check=False)
    states = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not states:
        return None
    return _merge_states(states)


def _merge_states(states: list[str]) -> str:
    # One state for a job; for an array: the first task state that is not terminal, else the first
    # that is not COMPLETED, else COMPLETED.
    for s in states:
        if s not in TERMINAL_STATES:
            return s
    for s in states:
        if s != "COMPLETED":
            return s
    return "COMPLETED"


def wait_job(job_id: str, timeout_s: float = 120.0, env: dict[str, str] | None = None, poll_s: float = 0.25) -> str:
    """Wait until the job (or every task of an array) is in a terminal state; return that state.

    Asks squeue first (it knows the job for MinJobAge=300 s after the end), then sacct. A requeued
    job goes back to PENDING and is waited for. Raises ``TimeoutError`` naming the last state seen.
    """
    deadline = time.monotonic() + timeout_s
    last: str | None = None
    while True:
        state = job_state(job_id, env=env)
        if state is None:
            state = sacct_state(job_id, env=env)
        if state is not None:
            last = state
            if state in TERMINAL_STATES:
                return state
        if time.monotonic() > deadline:
            raise TimeoutError(f"Slurm job {job_id} not finished after {timeout_s:.0f} s (last state: {last})")
        time.sleep(poll_s)


def wait_sacct(job_id: str, timeout_s: float = 15.0, env: dict[str, str] | None = None) -> str:
    """Wait until accounting holds the job's complete final record; return its state.

    slurmdbd lags slurmctld: for a job that ran for a second, sacct first shows it PENDING, then
    COMPLETED with an empty Partition and only the batch host as NodeList, and the full record
    (partition, all nodes, TRES) about 2 s after the end. So this waits for a terminal state AND a
    partition.
    """
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        args = ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State,Partition"]
        proc = run_slurm(args, env=env, check=False)
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode == 0 and rows:
            last = _merge_states([r[0].split()[0] for r in rows])
            if last in TERMINAL_STATES and all(len(r) > 1 and r[1] for r in rows):
                return last
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"sacct has no complete final record for job {job_id} after {timeout_s:.0f} s (last: {last})"
            )
        time.sleep(0.25)
