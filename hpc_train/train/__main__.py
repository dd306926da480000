"""``python -m hpc_train.train JOB [--set k=v]... [--epochs N] [--dry-run] [--run-dir DIR]`` — run this rank.

Under srun every task runs this (the plain sbatch script passes the fully resolved config it wrote into
the run directory); under torchrun every worker; the local launcher every local rank; alone it is a
one-process run. ``hpc-train train`` is this command. JOB is a job file or a shipped example's name.
Exit codes (:mod:`hpc_train.runs.rundir`): 0 done (or checkpointed and requeued), 1 training failed, 2 bad
config or data (one line on stderr saying what to change), 75 checkpointed after a preemption signal but
not requeued (continue with ``hpc-train submit --resume RUN``).
"""

from __future__ import annotations

import argparse
import sys

from hpc_train.rank import lifecycle  # it installs the signal handlers before anything heavy


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.train",
        description="Run one rank of an hpc-train job (the shared DDP long-tail training entrypoint).",
        epilog="example: python -m hpc_train.train cifar10_lt_ldam_drw --dry-run --set train.data.root=/data/cifar",
    )
    parser.add_argument("job", metavar="JOB", help="job file (the JobSpec schema: name, slurm, train), or the name "
                                                   "of a shipped example job (hpc-train jobs list)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.epochs=10 (repeatable)")
    parser.add_argument("--epochs", type=int, metavar="N", default=None,
                        help="train N epochs, every epoch-indexed key (warm-up, milestones, DRW, cRT) rescaled in "
                             "proportion; prints what it changed")
    parser.add_argument("--dry-run", action="store_true",
                        help="build data, model, sampler and loss, print the plan, exit without training")
    parser.add_argument("--resolved", action="store_true",
                        help="JOB is already fully resolved (the sbatch script's copy): do not layer the "
                             "site file under it again (it may not exist on compute nodes)")
    parser.add_argument("--run-dir", metavar="DIR", default=None,
                        help="run directory (default: $HPC_TRAIN_RUN_DIR, else <runs_dir>/<name>/local-<time>)")
    return parser


def _carry_run_dir(args: argparse.Namespace) -> None:
    """Run alone (no launcher), this process is its run's only process: ``hpc-train cancel`` ends it, and signals
    only a process that carries the run directory in its environment (``/proc/PID/environ``: what it was started
    with). So the process first starts itself again (``exec``: the same pid) with ``HPC_TRAIN_RUN_DIR`` set to the
    run directory it chose — before the rank's signal handlers are installed (an exec would drop them, and a
    preemption signal they had caught) and before torch is imported. A job that does not resolve is left to the
    normal path, which reports it."""
    import os

    from hpc_train.config import NO_SITE, job_path, resolve
    from hpc_train.errors import HpcTrainError
    from hpc_train.rank.dist import DistEnv
    from hpc_train.rank.interpreter import same_interpreter
    from hpc_train.runs import rundir

    try:
        if args.dry_run or os.environ.get(rundir.RUN_DIR_ENV) or DistEnv.from_environ().source != "single":
            return
        spec = resolve(job_path(args.job), sets=args.sets, site=NO_SITE if args.resolved else None,
                       epochs=args.epochs).spec
    except (HpcTrainError, OSError, ValueError):
        return
    chosen = args.run_dir or str(rundir.alone_run_dir(spec.runs_dir, spec.name))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, same_interpreter("-m", "hpc_train.train", *sys.argv[1:]),
              {**os.environ, rundir.RUN_DIR_ENV: os.path.abspath(chosen)})  # -X dev, -W ... as it was started


def main(argv: list[str] | None = None) -> int:
    """Parse → run this rank (:func:`hpc_train.rank.lifecycle.run`). Returns the exit code. Run alone from the
    command line (``argv`` None), the process first carries its run directory in its environment."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage; --help exits 0
        return int(exc.code or 0)

    if argv is None:  # the command line, not a test calling main()
        _carry_run_dir(args)

    def load_job():
        from hpc_train.config import NO_SITE, job_path, resolve
        from hpc_train.rank.dist import rank_and_host

        resolved = resolve(job_path(args.job), sets=args.sets, site=NO_SITE if args.resolved else None,
                           epochs=args.epochs)
        if resolved.epochs_change and rank_and_host()[0] in (0, None):
            print(resolved.epochs_change, file=sys.stderr, flush=True)
        return resolved.spec, resolved.sources.job_file

    return lifecycle.run(load_job, run_dir=args.run_dir, dry_run=args.dry_run).exit_code


if __name__ == "__main__":
    lifecycle.exit_now(main())
