"""The job: its name, where its runs go, and the ``slurm:`` section (what the sbatch script asks Slurm for
and how it launches the ranks). The ``train:`` section is :mod:`hpc_train.config.training`.

The dataclass fields *are* the schema (see :mod:`hpc_train.config.typed`); cross-field checks live in
:mod:`hpc_train.config.validate`. Torch-free and click-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .bounds import MAX_NODES, MAX_PACK, MAX_RANKS_PER_NODE, Bounds, bounded
from .slurm_options import Flag, Sbatch, option
from .training import TrainConfig
from .typed import to_plain

Launcher = Literal["srun", "torchrun"]
GpuFlag = Literal["gpus-per-node", "gres"]
ContainerRuntime = Literal["apptainer", "pyxis"]
HangAction = Literal["fail", "requeue"]
Workdir = Literal["run", "submit"]

# Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_RE = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")


def time_to_minutes(value: str) -> int:
    """Minutes of a Slurm ``--time`` string (rounded up, as Slurm does). Raises ValueError."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise ValueError(value)
    if m.group(1) is not None:  # D-HH[:MM[:SS]]
        days, hours = int(m.group(1)), int(m.group(2))
        minutes, seconds = int(m.group(3) or 0), int(m.group(4) or 0)
    else:
        parts = [int(p) for p in (m.group(5), m.group(6), m.group(7)) if p is not None]
        days = 0
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_s // 60)


@dataclass(frozen=True, kw_only=True)
class ContainerConfig:
    """Run every task inside a container (the image must hold Python and hpc-train[train])."""

    runtime: ContainerRuntime = "apptainer"
    """``apptainer`` wraps the launch command in ``apptainer exec --nv``; ``pyxis`` adds
    ``--container-image`` to srun (enroot/pyxis sites)."""
    image: str = ""
    """Image path (apptainer .sif) or reference (pyxis, e.g. ``nvcr.io#nvidia/pytorch:24.05-py3``)."""
    binds: tuple[str, ...] = ()
    """Host paths made visible in the container (``src[:dst]``). The submit directory is added."""


@dataclass(frozen=True, kw_only=True)
class SlurmConfig:
    """What the sbatch script asks Slurm for, and how it launches the ranks."""

    nodes: int = option(1, bounds=Bounds(low=1, high=MAX_NODES, hint="use --nodes N"), sbatch=Sbatch("nodes"),
                        flag=Flag("--nodes", "-N", envvar="HPC_TRAIN_NODES", help="Number of nodes."))
    """Number of nodes."""
    gpus_per_node: int = option(0, bounds=Bounds(low=0, high=MAX_RANKS_PER_NODE),
                                sbatch=Sbatch(write=lambda s: s.gpu_request, reads=("gres_name",),
                                              manages=("gpus", "gpus-per-node", "gpus-per-task", "gres"),
                                              advice=(("gpus-per-task", "(one rank per GPU)"),
                                                      ("gres", "with slurm.gpu_flag=gres and slurm.gres_name"))),
                                flag=Flag("--gpus", "-G", envvar="HPC_TRAIN_GPUS",
                                          help="GPUs per node; implies one rank per GPU unless --tasks-per-node is "
                                               "given."))
    """GPUs per node. 0 runs on CPUs (gloo)."""
    tasks_per_node: int | None = option(None, bounds=Bounds(low=1, high=MAX_RANKS_PER_NODE),
                                        sbatch=Sbatch("ntasks-per-node", value=lambda s: s.sbatch_tasks_per_node,
                                                      manages=("ntasks", "ntasks-per-node")),
                                        flag=Flag("--tasks-per-node", help="Ranks per node (CPU jobs; default: one per "
                                                                           "GPU)."))
    """Training processes (ranks) per node. Unset: one per GPU (``gpus_per_node``), or 1 without GPUs."""
    cpus_per_task: int = option(4, bounds=Bounds(low=1),
                                sbatch=Sbatch("cpus-per-task", value=lambda s: s.sbatch_cpus_per_task))
    """CPU cores per rank (data loading threads, OMP_NUM_THREADS)."""
    mem_gb: int | None = option(None, bounds=Bounds(low=0, says="0 (all memory) or more"), local=False,
                                sbatch=Sbatch("mem", unit="G", manages=("mem", "mem-per-cpu", "mem-per-gpu")))
    """Memory per node in GB; 0 asks for all of it; unset leaves the partition default."""
    time: str = option("01:00:00", sbatch=Sbatch("time"),
                       flag=Flag("--time", "-t", help="Time limit, Slurm format (e.g. 02:00:00, 1-00:00)."))
    """Wall-time limit in Slurm's format (``MM``, ``HH:MM:SS``, ``D-HH:MM`` ...)."""
    partition: str | None = option(None, sbatch=Sbatch("partition"), local=False,
                                   flag=Flag("--partition", "-p", envvar="HPC_TRAIN_PARTITION", help="Slurm partition."))
    account: str | None = option(None, sbatch=Sbatch("account"), local=False,
                                 flag=Flag("--account", "-A", envvar="HPC_TRAIN_ACCOUNT", help="Slurm account."))
    qos: str | None = option(None, sbatch=Sbatch("qos"), local=False)
    constraint: str | None = option(None, sbatch=Sbatch("constraint"), local=False)
    exclusive: bool = option(False, sbatch=Sbatch("exclusive", flag=True), local=False)
    """Ask for whole nodes (``--exclusive``)."""
    launcher: Launcher = option("srun", local=False,
                                flag=Flag("--launcher", help="Launch block: srun (one task per rank) or torchrun (one "
                                                             "per node)."))
    """``srun``: one Slurm task per rank (default). ``torchrun``: one task per node, c10d rendezvous."""
    template: str = option("default.sbatch.j2", local=False)
    """The sbatch template file, looked up on the template search path (site dirs first)."""
    modules: tuple[str, ...] = option((), local=False)
    """Environment modules to load after ``module purge`` (Lmod or Environment Modules)."""
    module_purge: bool = True
    """Run ``module purge`` before loading ``modules`` (only when modules are given)."""
    venv: str | None = option(None, local=False)
    """A virtualenv to activate on the nodes (its ``bin/activate`` is sourced)."""
    conda_env: str | None = option(None, local=False)
    """A conda environment to activate on the nodes (conda.sh is sourced first)."""
    python: str | None = option(None, local=False)
    """Interpreter that runs the ranks. Unset: ``python`` of the activated venv/conda env, else the
    interpreter that ran ``hpc-train``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank (NCCL/IB settings usually come from the site file)."""
    container: ContainerConfig | None = option(None, local=False)
    signal: str = option("USR2", sbatch=Sbatch(write=lambda s: s.signal_request, manages=("signal",),
                                               advice=(("signal", "and slurm.signal_delay_s"),)))
    """Signal Slurm sends before the time limit (and on preemption); it triggers checkpoint + requeue.
    Not USR1: NCCL uses it."""
    signal_delay_s: int = 120
    """Seconds before the time limit at which ``signal`` is sent."""
    requeue: bool = option(True, local="requeue", sbatch=Sbatch(write=lambda s: "--requeue" if s.requeue else "--no-requeue",
                                                                 manages=("requeue", "no-requeue")))
    """Requeue the job after a checkpoint on preemption or time limit."""
    max_requeues: int = option(3, bounds=Bounds(low=0, says="0 or more"), local="requeue")
    """Give up requeueing after this many restarts (``SLURM_RESTART_COUNT``)."""
    hang_timeout_s: int = bounded(900, low=0, says="0 (off) or more")
    """The watchdog (the batch script's, and the local launcher's): when no rank has advanced for this long
    after the first heartbeat, the ranks' Python stacks go into their logs, the run ends and is recorded
    ``failed`` with the rank and host that stopped first (docs/resilience.md). 0: off. Applies to local runs too."""
    hang_action: HangAction = "fail"
    """What the watchdog does after a hang: ``fail`` the run, or ``requeue`` it (at most ``max_requeues`` times;
    locally: launch it again), resuming from its last checkpoint."""
    exclude_bad_nodes: bool = option(True, local=False)
    """A requeue caused by a hang, a node failure or a rank failure the logs attribute to one node keeps that node
    out of the job's next attempts (``ExcNodeList``; the list is in the run directory). Slurm only."""
    gpu_flag: GpuFlag | None = option(None, local=False)
    """How GPUs are requested: ``--gpus-per-node=N`` or ``--gres=gpu:N``. Unset: ``--gpus-per-node``
    (preflight picks by Slurm version). Usually set once in the site file."""
    gres_name: str = option("gpu", local=False)
    """GRES name for ``gres`` (``--gres=<name>:N``), some sites use typed names like ``gpu:a100``."""
    cpu_bind: str | None = option(None, local=False)
    """``srun --cpu-bind=`` value (e.g. ``none`` on partitions with non-contiguous masks)."""
    srun_args: tuple[str, ...] = option((), local=False)
    """Extra srun arguments, each one word (they are quoted)."""
    extra_sbatch: Mapping[str, str | bool | None] = option(default_factory=dict, local=False)
    """Extra ``#SBATCH`` keys: ``{mail-type: END}`` → ``#SBATCH --mail-type=END``; ``true`` → bare flag,
    ``false`` or ``null`` → left out (a job file can drop a site file's key). Keys hpc-train writes itself
    (``nodes``, ``time``, ``output`` ...) are refused with the key or flag to use instead."""
    master_port_base: int = 20000
    """MASTER_PORT = base + (job id [+ array task id]) mod ``master_port_span``, bind-checked on node 1."""
    master_port_span: int = 12000
    """Range of candidate MASTER_PORTs (20000-31999 by default): below the kernel's ephemeral ports (32768
    and up), and the range the Ansible role opens in the firewall (slurm_gpu_node_rendezvous_port_range)."""
    pack: int = option(1, bounds=Bounds(low=1, high=MAX_PACK),
                       flag=Flag("--pack", metavar="K", group="sweep",
                                 help="Run K sweep points together in one allocation (one GPU, one node), each its "
                                      "own run (slurm.pack)."))
    """Sweep points run together in one allocation, each its own run (``--pack K``): K small runs share
    the one GPU (and K x ``cpus_per_task`` cores) of one array task. One node, one rank per point."""

    @property
    def ranks_per_node(self) -> int:
        """Training processes per node, whatever the launcher."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def sbatch_tasks_per_node(self) -> int:
        """``--ntasks-per-node``: every rank is a task under srun; torchrun is one task per node."""
        return 1 if self.launcher == "torchrun" else self.ranks_per_node

    @property
    def sbatch_cpus_per_task(self) -> int:
        """``--cpus-per-task``: torchrun's single task holds the cores of all its workers."""
        if self.launcher == "torchrun":
            return self.cpus_per_task * self.ranks_per_node
        return self.cpus_per_task * self.pack

    @property
    def gpu_request(self) -> str | None:
        """The GPU line's option: ``--gpus-per-node=N``, or ``--gres=<name>:N`` (``gpu_flag: gres``); none without GPUs."""
        if self.gpus_per_node <= 0:
            return None
        if self.gpu_flag == "gres":
            return f"--gres={self.gres_name}:{self.gpus_per_node}"
        return f"--gpus-per-node={self.gpus_per_node}"

    @property
    def signal_request(self) -> str:
        """``--signal``: torchrun's batch shell takes the signal itself (``B:``) and forwards it to the workers."""
        return f"--signal={'B:' if self.launcher == 'torchrun' else ''}{self.signal}@{self.signal_delay_s}"

    @property
    def time_min(self) -> int:
        return time_to_minutes(self.time)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A fully resolved job: what ``render`` turns into an sbatch script and every rank runs."""

    name: str = option("hpc-train", sbatch=Sbatch("job-name"),
                       flag=Flag("--name", help="Job name (also the run-directory group)."))
    """Job name (Slurm ``--job-name``) and the run-directory group under ``runs_dir``."""
    runs_dir: str = option("runs", flag=Flag("--runs-dir", envvar="HPC_TRAIN_RUNS_DIR",
                                             help="Where run directories go (default: the job's runs_dir, ./runs)."))
    """Where run directories go (``<runs_dir>/<name>/<job id>``); relative to the submit directory.
    On a cluster it must be on a filesystem every node sees."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    command: tuple[str, ...] = ()
    """Your own program (``hpc-train submit -- CMD ARGS...``): every rank runs this argv, exactly as written,
    with the rank mapping in its environment (docs/commands.md); ``train:`` is then not used. Empty: the
    shared long-tail trainer."""
    workdir: Workdir = option("run", flag=Flag(
        "--workdir", help="Where your command (after --) runs: run = the run's own <run dir>/work (a new run never "
                          "sees another's files; a relative program or python SCRIPT still means the submit "
                          "directory's); submit = the submit directory, shared by every run."))
    """Where a command job's ranks run (docs/commands.md, "Where a client's files go"): ``run``, the run's own
    ``<run_dir>/work`` (made at its first launch, the same across requeues and ``--resume``, never shared);
    ``submit``, the submit directory (every run started there shares it: for scripts that read relative data
    paths). The trainer ignores it (it writes only into its run directory)."""

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)
