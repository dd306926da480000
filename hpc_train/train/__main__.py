"""``python -m hpc_train.train JOB.yaml [--set k=v]... [--epochs N] [--dry-run] [--run-dir DIR]`` — run this rank.

Under srun every task runs this (the plain sbatch script passes the fully resolved config it wrote
into the run directory); under torchrun every worker; alone it is a one-process run. Exit codes:
0 done (or checkpointed and requeued), 1 training failed, 2 bad config or data (one line on stderr
saying what to change), 75 checkpointed after a preemption signal but not requeued (continue with
``hpc-train submit --resume RUN``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpc_train.train import preempt  # torch-free; nothing heavy is imported before main() installs it


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.train",
        description="Run one rank of an hpc-train job (the shared DDP long-tail training entrypoint).",
        epilog="example: python -m hpc_train.train jobs/cifar10_lt_ldam_drw.yaml --dry-run "
               "--set train.data.root=/data/cifar",
    )
    parser.add_argument("job", metavar="JOB.yaml", help="job file (the JobSpec schema: name, slurm, train)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.epochs=10 (repeatable)")
    parser.add_argument("--epochs", type=int, metavar="N", default=None,
                        help="train N epochs, every epoch-indexed key (warm-up, milestones, DRW, cRT) rescaled in "
                             "proportion; prints what it changed")
    parser.add_argument("--dry-run", action="store_true",
                        help="build data, model, sampler and loss, print the plan, exit without training")
    parser.add_argument("--resolved", action="store_true",
                        help="JOB.yaml is already fully resolved (the sbatch script's copy): do not layer the "
                             "site file under it again (it may not exist on compute nodes)")
    parser.add_argument("--run-dir", metavar="DIR", default=None,
                        help="run directory (default: $HPC_TRAIN_RUN_DIR, else <runs_dir>/<name>/local-<time>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse → build → fit → close. Returns the exit code (see the module docstring)."""
    # First thing: Slurm may send USR2 seconds after the task starts, and its default action would kill
    # the rank during the seconds-long torch import. USR2 and TERM now; the job's own signal once read.
    preempt.install()
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage; --help exits 0
        return int(exc.code or 0)

    from hpc_train.config import SiteConfig, resolve_job
    from hpc_train.errors import HpcTrainError

    try:
        site = SiteConfig(path=None, defaults={}, template_dirs=()) if args.resolved else None
        spec, sources = resolve_job(Path(args.job), sets=args.sets, site=site)
        if args.epochs is not None:
            from hpc_train.epochs import describe, rescale

            spec, changes = rescale(spec, args.epochs)
            if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
                print(describe(args.epochs, changes), file=sys.stderr, flush=True)
        preempt.install(spec.slurm.signal)
        from hpc_train.train import launch  # imports torch

        outcome = launch.run(spec, run_dir=args.run_dir, dry_run=args.dry_run, job_file=sources.job_file)
    except HpcTrainError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except Exception:  # noqa: BLE001 - a crash: say which rank and host, keep the traceback
        import logging
        import socket

        from hpc_train.dist import DistEnv

        try:
            where = f"rank {DistEnv.from_environ().rank} on {socket.gethostname()}"
        except HpcTrainError:
            where = f"on {socket.gethostname()}"
        logging.getLogger("hpc_train.train").exception("training failed (%s)", where)
        print(f"error: training failed ({where}); see the traceback above", file=sys.stderr, flush=True)
        return 1
    return outcome.exit_code


def _exit_now(code: int) -> None:
    """Exit without running C++ static destructors: the work is done and flushed, and torch's process-group
    threads torn down at interpreter exit have aborted ranks of finished jobs (SIGABRT fails the step)."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
