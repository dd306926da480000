"""Who am I in the job: one place that maps launcher variables to torch's RANK / LOCAL_RANK / ...

Sources, first match wins:

1. torchrun, hpc-train's local launcher (``HPC_TRAIN_LAUNCHER=local``), or any launcher that sets
   ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``;
2. a Slurm step: ``SLURM_PROCID→RANK``, ``SLURM_LOCALID→LOCAL_RANK``, ``SLURM_NTASKS→WORLD_SIZE``,
   ``SLURM_NODEID→NODE_RANK``, tasks on this node → ``LOCAL_WORLD_SIZE`` (the ``8(x4)`` form included);
3. submitit's local executor (``SUBMITIT_LOCAL_*``);
4. a single process.

``MASTER_ADDR`` / ``MASTER_PORT`` come from the environment (the batch shell exports them once, see
templates/partials/rendezvous.j2), else the first host of the node list and a port derived from the job
id — the same formula as the template (:func:`master_port_for`). Mismatches raise :class:`DistError`
with what to change: a wrong world size hangs ``init_process_group`` until the timeout, so we check first.

torch is imported inside functions only: the CLI imports this module.
"""

from __future__ import annotations

import atexit
import os
import socket
from dataclasses import dataclass
from typing import Literal, Mapping, NoReturn

from .. import launch_env
from ..errors import HpcTrainError
from ..runs import rundir
from . import hostlist

Source = Literal["torchrun", "local", "slurm", "submitit-local", "single"]

DEFAULT_PORT_BASE = 20000
DEFAULT_PORT_SPAN = 12000
MAX_SIMULATED_RANKS = 100_000


class DistError(HpcTrainError):
    """The launcher's view of the job is inconsistent; the message says what to change (exit 2)."""


def master_port_for(job_id: int, array_task_id: int | None = None, *, base: int = DEFAULT_PORT_BASE,
                    span: int = DEFAULT_PORT_SPAN) -> int:
    """Port derived from the job id (+ array task id). Two jobs sharing a node get different ports unless
    their ids collide modulo ``span``; the batch shell then bind-checks and moves on."""
    return base + (job_id + (array_task_id or 0)) % span


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise DistError(f"{name}={raw!r} is not an integer; the launcher environment is broken") from None


def _opt_int(environ: Mapping[str, str], name: str) -> int | None:
    return _int(environ, name) if environ.get(name, "") != "" else None


def _first_host(nodelist: str, num_nodes: int) -> str:
    """The first host of a node list, counted before it is expanded (``gpu[1-99999999]`` is refused in
    microseconds, as ``simulate`` does, never expanded into a hundred million names)."""
    hosts = hostlist.count(nodelist)
    if hosts > MAX_SIMULATED_RANKS:
        raise DistError(f"the node list {nodelist!r:.80} names {hosts:,} hosts (the step has {num_nodes}); the "
                        "launcher's environment is broken")
    return hostlist.expand(nodelist, max_hosts=MAX_SIMULATED_RANKS)[0]


def visible_gpu_count(environ: Mapping[str, str]) -> int | None:
    """GPUs this process may see according to CUDA_VISIBLE_DEVICES (None when unset)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    value = value.strip()
    if value in ("", "-1", "NoDevFiles"):
        return 0
    return len([v for v in value.split(",") if v.strip()])


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job (a frozen snapshot of the environment)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: Source
    hostname: str
    job_id: str | None = None
    visible_gpus: int | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "DistEnv":
        env = os.environ if environ is None else environ
        hostname = rank_and_host(env)[1]
        visible = visible_gpu_count(env)
        if all(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
            dist = cls._from_torchrun(env, hostname, visible)
        elif "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
            dist = cls._from_slurm(env, hostname, visible)
        elif "SUBMITIT_LOCAL_GLOBALID" in env:
            dist = cls._from_submitit_local(env, hostname, visible)
        else:
            dist = cls(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
                       master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                       master_port=launch_env.master_port(env, 29500), source="single",
                       hostname=hostname, visible_gpus=visible)
        dist.check()
        return dist

    @classmethod
    def _from_torchrun(cls, env: Mapping[str, str], hostname: str, visible: int | None) -> "DistEnv":
        world = _int(env, "WORLD_SIZE")
        local_world = _opt_int(env, "LOCAL_WORLD_SIZE") or world
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise DistError("RANK/WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not; "
                            "launch with torchrun, or unset RANK/LOCAL_RANK/WORLD_SIZE")
        return cls(
            rank=_int(env, "RANK"), local_rank=_int(env, "LOCAL_RANK"), world_size=world,
            local_world_size=local_world,
            node_rank=_opt_int(env, "GROUP_RANK") or _opt_int(env, "NODE_RANK") or _int(env, "RANK") // local_world,
            num_nodes=max(1, world // local_world), master_addr=env["MASTER_ADDR"],
            master_port=launch_env.master_port(env), hostname=hostname,
            source="local" if env.get("HPC_TRAIN_LAUNCHER") == "local" else "torchrun",
            job_id=env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID"), visible_gpus=visible,
        )

    @classmethod
    def _from_slurm(cls, env: Mapping[str, str], hostname: str, visible: int | None) -> "DistEnv":
        # Step-level variables describe the srun step we are in; job-level ones the allocation.
        world = _opt_int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        num_nodes = (_opt_int(env, "SLURM_STEP_NUM_NODES") or _opt_int(env, "SLURM_JOB_NUM_NODES")
                     or _opt_int(env, "SLURM_NNODES") or 1)
        node_rank = _opt_int(env, "SLURM_NODEID") or 0
        per_node_raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if per_node_raw:
            per_node = hostlist.expand_tasks_per_node(per_node_raw)
            if sum(per_node) != world:
                raise DistError(
                    f"Slurm says {world} tasks but {per_node_raw!r} tasks per node add up to {sum(per_node)}; "
                    "pass --ntasks-per-node to sbatch/srun instead of --ntasks"
                )
            local_world = per_node[node_rank] if node_rank < len(per_node) else per_node[-1]
        else:
            local_world = world // num_nodes
        master_addr = env.get("MASTER_ADDR")
        if not master_addr:
            if not nodelist:
                raise DistError("cannot determine MASTER_ADDR: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; "
                                "export MASTER_ADDR in the batch script before srun")
            master_addr = _first_host(nodelist, num_nodes)
        job_id = env.get("SLURM_JOB_ID")
        if env.get("MASTER_PORT"):
            master_port = launch_env.master_port(env)
        elif job_id:
            array_job = _opt_int(env, "SLURM_ARRAY_JOB_ID")
            master_port = master_port_for(array_job if array_job is not None else int(launch_env.job_id(env)),
                                          _opt_int(env, "SLURM_ARRAY_TASK_ID"))
        else:
            raise DistError("cannot determine MASTER_PORT: neither MASTER_PORT nor SLURM_JOB_ID is set")
        return cls(
            rank=_int(env, "SLURM_PROCID"), local_rank=_opt_int(env, "SLURM_LOCALID") or 0, world_size=world,
            local_world_size=local_world, node_rank=node_rank, num_nodes=num_nodes, master_addr=master_addr,
            master_port=master_port, source="slurm", hostname=hostname, job_id=job_id, visible_gpus=visible,
        )

    @classmethod
    def _from_submitit_local(cls, env: Mapping[str, str], hostname: str, visible: int | None) -> "DistEnv":
        world = _int(env, "SUBMITIT_LOCAL_NTASKS")
        job_id = env.get("SUBMITIT_LOCAL_JOB_ID", "0")
        port = launch_env.master_port(env) if env.get("MASTER_PORT") else master_port_for(int(job_id) if job_id.isdigit() else 0)
        return cls(
            rank=_int(env, "SUBMITIT_LOCAL_GLOBALID"), local_rank=_int(env, "SUBMITIT_LOCAL_LOCALID"),
            world_size=world, local_world_size=world, node_rank=_opt_int(env, "SUBMITIT_LOCAL_NODEID") or 0,
            num_nodes=_opt_int(env, "SUBMITIT_LOCAL_JOB_NUM_NODES") or 1,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=port, source="submitit-local",
            hostname=hostname, job_id=job_id, visible_gpus=visible,
        )

    # ------------------------------------------------------------------------------------------
    def check(self, expected_world_size: int | None = None) -> None:
        """Fail fast instead of hanging in init_process_group."""
        if not (0 <= self.rank < self.world_size):
            raise DistError(f"rank {self.rank} is outside world size {self.world_size} ({self.source})")
        if not (0 <= self.local_rank < self.local_world_size):
            raise DistError(
                f"local rank {self.local_rank} is outside the {self.local_world_size} tasks on {self.hostname}"
            )
        if self.source == "slurm" and self.local_world_size * self.num_nodes != self.world_size:
            raise DistError(
                f"world size {self.world_size} != {self.num_nodes} nodes x {self.local_world_size} tasks per node; "
                "use --ntasks-per-node (not --ntasks) so every node runs the same number of ranks"
            )
        if expected_world_size is not None and expected_world_size != self.world_size:
            raise DistError(
                f"the job config expects {expected_world_size} ranks but the launcher started {self.world_size} "
                f"({self.source}); make slurm.nodes x slurm.tasks_per_node match the allocation"
            )
        if not self.master_addr:
            raise DistError("MASTER_ADDR is empty; export it in the batch script before launching the ranks")

    def cuda_device_index(self, device_count: int) -> int:
        """Which CUDA device this rank drives: LOCAL_RANK, or 0 when the task sees exactly one GPU
        (per-task binding, ``--gpus-per-task=1``)."""
        if device_count == 1:
            return 0
        if self.local_rank >= device_count:
            raise DistError(
                f"local rank {self.local_rank} on {self.hostname} but only {device_count} GPU(s) visible; "
                "ask for one GPU per task (--gpus G with G ranks per node)"
            )
        return self.local_rank

    def torch_environ(self) -> dict[str, str]:
        """The variables ``init_process_group(init_method='env://')`` and friends read."""
        return {
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size), "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank), "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
        }

    def export(self, environ: dict[str, str] | None = None) -> None:
        (os.environ if environ is None else environ).update(self.torch_environ())


def rank_and_host(environ: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """This process's rank and host for a message, read in :meth:`DistEnv.from_environ`'s order (torchrun's or
    the local launcher's ``RANK``, Slurm's ``SLURM_PROCID``, submitit-local's) — tolerantly: it names the rank
    whose environment may be what is broken. The rank is None when no launcher says one."""
    env = os.environ if environ is None else environ
    host = env.get("SLURMD_NODENAME") or socket.gethostname()
    for name in ("RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID"):
        if env.get(name, "").isdigit():
            return int(env[name]), host
    return None, host


def simulate(nodelist: str, *, nodes: int, ranks_per_node: int, job_id: int = 1234,
             array_task_id: int | None = None, port_base: int = DEFAULT_PORT_BASE,
             port_span: int = DEFAULT_PORT_SPAN) -> list[DistEnv]:
    """What each rank of an allocation would see, computed by feeding Slurm-shaped environments to
    :meth:`DistEnv.from_environ` — the same code path the ranks run."""
    found = hostlist.count(nodelist)  # counted, not expanded: 'gpu[1-99999999]' must not build a list first
    if found != nodes:
        raise DistError(f"node list {nodelist!r} has {found:,} hosts but the job asks for {nodes} nodes; "
                        "give a node list with exactly that many hosts")
    world = nodes * ranks_per_node
    if world > MAX_SIMULATED_RANKS:
        raise DistError(f"{world:,} ranks; simulate shows at most {MAX_SIMULATED_RANKS:,} (a few nodes tell the pattern)")
    hosts = hostlist.expand(nodelist)
    out = []
    for node_rank, host in enumerate(hosts):
        for local_rank in range(ranks_per_node):
            env = {
                "SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(node_rank * ranks_per_node + local_rank),
                "SLURM_LOCALID": str(local_rank), "SLURM_NODEID": str(node_rank), "SLURM_NTASKS": str(world),
                "SLURM_STEP_NUM_TASKS": str(world), "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes),
                "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
                "SLURM_STEP_TASKS_PER_NODE": f"{ranks_per_node}(x{nodes})" if nodes > 1 else str(ranks_per_node),
                "SLURMD_NODENAME": host,
                "MASTER_ADDR": hosts[0],
                "MASTER_PORT": str(master_port_for(job_id, array_task_id, base=port_base, span=port_span)),
            }
            out.append(DistEnv.from_environ(env))
    return out


def launch_info(environ: Mapping[str, str] | None = None) -> dict[str, str | int | None]:
    """For your own command: the run directory, where to checkpoint, which restart this is, and the
    preemption contract (docs/commands.md), from the variables hpc-train sets for every rank."""
    env = os.environ if environ is None else environ
    restart_name = "HPC_TRAIN_RESTART" if env.get("HPC_TRAIN_RESTART") else "SLURM_RESTART_COUNT"
    return {"run_dir": env.get("HPC_TRAIN_RUN_DIR"), "checkpoint_dir": env.get("HPC_TRAIN_CHECKPOINT_DIR"),
            "restart": launch_env.restart_count(env, restart_name), "signal": env.get("HPC_TRAIN_SIGNAL", "USR2"),
            "signal_delay_s": launch_env.env_int(env, "HPC_TRAIN_SIGNAL_DELAY_S", 0, 366 * 86400, default=0) or None,
            "exit_requeue": launch_env.env_int(env, "HPC_TRAIN_EXIT_REQUEUE", 1, 255, default=rundir.EXIT_CHECKPOINTED)}


def setup(*, backend: str | None = None, timeout_s: int = 600) -> DistEnv:
    """One call for your own code: the validated mapping (:meth:`DistEnv.from_environ`), this rank's GPU
    (``LOCAL_RANK``, when CUDA is there), and the default process group (world size > 1; ``nccl`` on GPUs,
    ``gloo`` on CPUs unless ``backend`` says). At interpreter exit :func:`teardown` hands the GIL to torch's
    communication threads once more (see there); end the script with :func:`leave` for an exit that cannot
    abort. torch is imported here, not at import time. ::

        from hpc_train.dist import leave, setup
        env = setup()            # then DDP(model, device_ids=[env.local_rank]) on GPUs
        ...
        leave(0)                 # or leave(75) after the checkpoint, on hpc-train's signal
    """
    import torch

    env = DistEnv.from_environ()
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if cuda:
        torch.cuda.set_device(env.cuda_device_index(torch.cuda.device_count()))
    if env.is_distributed:
        init_process_group(env, backend=backend or ("nccl" if cuda else "gloo"), timeout_s=timeout_s)
        atexit.unregister(teardown)  # once, however often setup() is called
        atexit.register(teardown)
    return env


def catch_preemption() -> str:
    """Catch hpc-train's preemption signal (``HPC_TRAIN_SIGNAL``, USR2 unless the job says otherwise): from now on
    it only sets the flag :func:`stop_requested` reads, instead of ending the process. SIGTERM keeps its default
    (a cancelled run ends at once). Call it first thing: a signal that comes before still ends the process.
    Returns the signal's name. Torch-free."""
    from . import preempt

    name = os.environ.get("HPC_TRAIN_SIGNAL") or "USR2"
    preempt.install(name, also=())
    return name


def stop_requested() -> bool:
    """Whether the signal :func:`catch_preemption` caught has come: checkpoint at the next step boundary (all
    ranks agreeing: all-reduce the flag), then :func:`leave` with ``HPC_TRAIN_EXIT_REQUEUE`` (75)."""
    from . import preempt

    return preempt.requested()


TEARDOWN_GIL_HANDOVER_S = 0.2
"""How long :func:`teardown` leaves the GIL to torch's threads at exit (in 10 ms slices)."""


def teardown() -> None:
    """Let torch's communication threads drop their finished work while the interpreter can still serve them.

    Why (issue 27; a core dump of an aborted gloo rank): a DDP backward pass stashes a Python object (the
    ``contextvars`` context) in the thread-local state that every collective it starts copies. The gloo worker
    thread that ran the last all-reduce releases that work after the main thread has already been woken, and
    releasing it decrefs the Python object, which takes the GIL. When the main thread has meanwhile reached
    ``Py_FinalizeEx``, taking the GIL ends the worker thread (``pthread_exit``) inside a ``noexcept``
    destructor: ``std::terminate``, "terminate called without an active exception", SIGABRT (exit 134) after
    the work was done. ``destroy_process_group()`` does not help: DDP's reducer still holds the group (its
    threads are not joined) and gloo has no ``shutdown``. Here, still before finalisation, the main thread
    sleeps a few times, releasing the GIL to any worker waiting for it. That narrows the race; only
    :func:`leave` (no finalisation at all) closes it."""
    import time

    deadline = time.monotonic() + TEARDOWN_GIL_HANDOVER_S
    while time.monotonic() < deadline:
        time.sleep(0.01)


def leave(code: int = 0) -> NoReturn:
    """End this rank with ``code`` without the interpreter's finalisation (``os._exit`` after flushing
    ``sys.stdout``/``sys.stderr``), as hpc-train's own ranks do: nothing of torch's is destroyed while its threads
    still run, so a finished rank cannot abort at exit (:func:`teardown` says why it would). Call it last,
    after your files are closed and every rank is done with collectives (``leave(75)`` after the checkpoint
    on hpc-train's signal). Torch-free."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be said on it
            pass
    os._exit(code)


def init_process_group(dist: DistEnv, *, backend: str, timeout_s: int) -> None:
    """Create the default process group from ``dist`` (env:// rendezvous at MASTER_ADDR:MASTER_PORT)."""
    import datetime

    import torch.distributed as tdist

    dist.export()
    tdist.init_process_group(backend=backend, init_method="env://", rank=dist.rank, world_size=dist.world_size,
                             timeout=datetime.timedelta(seconds=timeout_s))
