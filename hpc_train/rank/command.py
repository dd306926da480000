"""``python -m hpc_train.command --resolved JOB.yaml``: one rank of a job that runs the user's own command
(``hpc-train submit -- CMD ARGS...``, or ``command:`` in a job file). Torch-free.

Every launcher (srun, torchrun, the local launcher, the submitit callable) starts this in each rank; it
reads the job, validates the rank mapping (:class:`hpc_train.dist.DistEnv`: a launcher that started another
world size than the job's fails here, with what to change), exports it, records what the rank saw in the run
directory, and then *becomes* the command (``exec``): the command is the rank's process, so Slurm's signals,
its exit code and its output are its own. The argv is the job's ``command`` list exactly as written; it never
passes through a shell; only a first word ``python``/``python3`` is replaced by the job's interpreter (the one
running this wrapper). The command runs in the run's own ``<run_dir>/work`` (``workdir: run``; a relative program
or python SCRIPT is made absolute in the submit directory first, where every launcher starts this wrapper) or
in the submit directory (``workdir: submit``); a program or script that is not there is exit 127, "program not
found: NAME", recorded as the run's reason. Under torchrun on Slurm, the step's per-node ``SLURM_PROCID``/``SLURM_NTASKS``/... are
replaced by the rank's own values (:func:`slurm_view_of_rank`).

The contract for the command (docs/commands.md):

* environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``HPC_TRAIN_RUN_DIR`` (the run directory), ``HPC_TRAIN_CHECKPOINT_DIR`` (``checkpoints/``
  in it), ``HPC_TRAIN_SUBMIT_DIR`` (the submit directory), ``HPC_TRAIN_RESTART`` (0 on the first start; ``SLURM_RESTART_COUNT`` under Slurm),
  ``HPC_TRAIN_SIGNAL`` and ``HPC_TRAIN_SIGNAL_DELAY_S`` (the signal sent that long before the time limit),
  ``HPC_TRAIN_EXIT_REQUEUE`` (75);
* ``launch.json`` in the run directory says the same in words, for this start;
* on the signal: write a checkpoint, then every rank exits 75; the job is requeued (at most
  ``slurm.max_requeues`` times) and the command starts again with ``HPC_TRAIN_RESTART`` one higher. Any other
  exit code ends the run: 0 completed, else failed (with the first failing rank and its host named).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

from ..config.command_paths import PYTHON_WORDS, anchored, script_index
from ..errors import HpcTrainError
from ..runs import rundir

EXIT_NOT_FOUND = rundir.EXIT_NOT_FOUND
LAUNCH_JSON = "launch.json"
CONTRACT = ("on {signal} (sent {delay} s before the time limit, and on preemption): write a checkpoint, then exit "
            "75 from every rank; the job is requeued (at most {max_requeues} times, requeue {requeue}) and starts "
            "again with HPC_TRAIN_RESTART one higher. Exit 0: completed; any other code: failed.")


SUBMIT_DIR_ENV = "HPC_TRAIN_SUBMIT_DIR"


def contract_environment(spec, run_dir: Path, restart: int, submit_dir: Path) -> dict[str, str]:
    """What the command learns from its environment besides the rank mapping."""
    s = spec.slurm
    return {
        rundir.RUN_DIR_ENV: str(run_dir), "HPC_TRAIN_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        SUBMIT_DIR_ENV: str(submit_dir),
        "HPC_TRAIN_RESTART": str(restart), "HPC_TRAIN_SIGNAL": s.signal,
        "HPC_TRAIN_SIGNAL_DELAY_S": str(s.signal_delay_s), "HPC_TRAIN_EXIT_REQUEUE": str(rundir.EXIT_CHECKPOINTED),
        "HPC_TRAIN_MAX_REQUEUES": str(s.max_requeues if s.requeue else 0),
    }


def launch_record(spec, restart: int) -> dict:
    s = spec.slurm
    return {"restart": restart, "restarted": restart > 0, "signal": s.signal, "signal_delay_s": s.signal_delay_s,
            "requeue": s.requeue, "max_requeues": s.max_requeues, "exit_requeue": rundir.EXIT_CHECKPOINTED,
            "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"), "time": rundir.now(),
            "contract": CONTRACT.format(signal=s.signal, delay=s.signal_delay_s, max_requeues=s.max_requeues,
                                        requeue="on" if s.requeue else "off")}


def resolve_program(argv: list[str]) -> list[str]:
    """The argv to exec: ``python``/``python3`` as the first word (:data:`PYTHON_WORDS`) is the job's interpreter
    (``sys.executable`` here: ``$PYTHON`` of the batch script, the local launcher's), not whatever ``python`` a
    rank's PATH finds first (or none: exit 127); every other word stays as in the job."""
    if argv and argv[0] in PYTHON_WORDS:
        return [sys.executable, *argv[1:]]
    return list(argv)


def work_dir(spec, run_dir: Path, submit_dir: Path) -> Path:
    """Where the command runs: ``workdir: run``, the run's own ``<run_dir>/work`` (made here at its first launch,
    never through a planted symlink: a file hpc-train makes in a run directory follows none, decision 12);
    ``workdir: submit``, the directory the launcher started in (the submit directory)."""
    if spec.workdir != "run":
        return submit_dir
    path = run_dir / rundir.WORK_DIR
    try:
        path.mkdir(exist_ok=True)
    except FileExistsError:
        pass  # not a directory: refused below
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise HpcTrainError(f"{path} is not a directory (a symlink or a file): the run's working directory must be "
                            "its own; remove it and --resume the run")
    return path


def missing_script(argv: list[str], cwd: Path) -> str | None:
    """The SCRIPT of ``python SCRIPT`` when it is not a file (from ``cwd``, as python opens it), else None:
    python's own exit 2 for it would read as "bad configuration"; the launch says 127, as for a missing
    program (which ``exec`` itself finds out: :func:`become`)."""
    script = script_index(argv)
    if script is not None and not (cwd / argv[script]).is_file():
        return argv[script]
    return None


def slurm_view_of_rank(env, environ) -> dict[str, str]:
    """Under torchrun in a Slurm step, the step's ``SLURM_PROCID``/``SLURM_NTASKS``/... describe the node's one
    torchrun task (every worker saw ``SLURM_PROCID=0``, ``SLURM_NTASKS=1`` per node); a client that reads Slurm's
    variables (Lightning's SLURMEnvironment, idr_torch, submitit's helpers) would take them for its rank's. Give
    the worker the rank's own values instead, consistent with ``RANK``/``WORLD_SIZE``. Elsewhere: nothing (under
    srun they are already the rank's; the local launcher removes them)."""
    if env.source != "torchrun" or "SLURM_PROCID" not in environ:
        return {}
    per_node = f"{env.local_world_size}(x{env.num_nodes})" if env.num_nodes > 1 else str(env.local_world_size)
    return {"SLURM_PROCID": str(env.rank), "SLURM_LOCALID": str(env.local_rank), "SLURM_NODEID": str(env.node_rank),
            "SLURM_NTASKS": str(env.world_size), "SLURM_NPROCS": str(env.world_size),
            "SLURM_STEP_NUM_TASKS": str(env.world_size), "SLURM_NTASKS_PER_NODE": str(env.local_world_size),
            "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_TASKS_PER_NODE": per_node}


def prepare(spec, run_dir: Path, submit_dir: Path) -> dict[str, str]:
    """Validate the mapping, record the rank, and return the command's environment."""
    from .dist import DistEnv

    env = DistEnv.from_environ()
    if env.source != "single":
        env.check(expected_world_size=spec.slurm.world_size)
    _, restart = rundir.instance_of()
    (run_dir / rundir.RANKS_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    record = {"rank": env.rank, "local_rank": env.local_rank, "node_rank": env.node_rank,
              "world_size": env.world_size, "local_world_size": env.local_world_size,
              "master_addr": env.master_addr, "master_port": env.master_port, "hostname": env.hostname,
              "source": env.source, "pid": os.getpid(), "job_id": env.job_id, "restart_count": restart,
              "command": list(spec.command), "host": socket.gethostname(), "submit_dir": str(submit_dir)}
    rundir.write_json_atomic(run_dir / rundir.RANKS_DIR / f"rank-{env.rank}.json", record)
    if env.rank == 0:
        rundir.write_json_atomic(run_dir / LAUNCH_JSON, launch_record(spec, restart))
    mapped = {"HPC_TRAIN_MAPPED_FROM": env.source}  # the command sees torchrun-style variables; where they came from
    return {**os.environ, **slurm_view_of_rank(env, os.environ), **env.torch_environ(),
            **contract_environment(spec, run_dir, restart, submit_dir), **mapped}


def become(argv: list[str], environ: dict[str, str], signals: tuple[str, ...], run_dir: Path) -> NoReturn:
    """exec the command with default dispositions for the preemption signals: a launcher may have set them
    to ignored (torchrun's agent does, and ignored signals survive exec); the command decides for itself."""
    from .preempt import signal_number

    for name in signals:
        signal.signal(signal_number(name), signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, environ)
    except FileNotFoundError:
        not_found(argv[0], run_dir)
    except OSError as exc:
        print(f"hpc-train: {argv[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        os._exit(126)


def not_found(name: str, run_dir: Path) -> NoReturn:
    """Exit 127 (a shell's code for it) with the reason on stderr and in the run's state."""
    from .lifecycle import record_failure

    reason = f"program not found: {name}"
    print(f"hpc-train: {reason}", file=sys.stderr, flush=True)
    record_failure(run_dir, reason, EXIT_NOT_FOUND)
    os._exit(EXIT_NOT_FOUND)


def run(spec, run_dir: Path) -> NoReturn:
    run_dir, submit_dir = run_dir.absolute(), Path.cwd()  # every launcher starts the ranks in the submit directory
    environ = prepare(spec, run_dir, submit_dir)
    cwd = work_dir(spec, run_dir, submit_dir)
    typed = list(spec.command)  # a relative program or python SCRIPT: the submit directory's, wherever it runs
    argv = resolve_program(anchored(typed, submit_dir) if spec.workdir == "run" else typed)
    missing = missing_script(argv, cwd)
    if missing is not None:
        not_found(missing, run_dir)
    os.chdir(cwd)
    environ["PWD"] = str(cwd)  # what a shell or os.getcwd() of the command says
    become(argv, environ, (spec.slurm.signal, "TERM"), run_dir)


def start(load_spec: Callable[[], Any], run_dir: Path) -> int:
    """Read the job and become its command; an exit code (and a line on stderr, and the reason in the run's
    state) when that cannot happen."""
    from .lifecycle import record_failure  # the trainer's ranks record their failure the same way

    try:
        spec = load_spec()
        if not spec.command:
            raise HpcTrainError("the job has no command; run the trainer with python -m hpc_train.train")
        run(spec, run_dir)
    except HpcTrainError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        record_failure(run_dir, str(exc), exc.exit_code)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        record_failure(run_dir, str(exc), rundir.EXIT_FAILED)
        return rundir.EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    """``python -m hpc_train.command --resolved JOB.yaml``: read the job, become its command."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--resolved":
        print("usage: python -m hpc_train.command --resolved JOB.yaml (the run directory's job.yaml)", file=sys.stderr)
        return rundir.EXIT_BAD_INPUT
    job_file = Path(args[1])

    def load_spec():
        from ..config import read_text_file, spec_from_yaml_text

        return spec_from_yaml_text(read_text_file(job_file, "job file"), str(job_file))

    return start(load_spec, Path(os.environ.get(rundir.RUN_DIR_ENV) or job_file.parent))

