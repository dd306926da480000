"""The submitit callable: torch-free to import and to unpickle; it imports training code when called.

``submit`` pickles ``TrainJob(config_yaml, run_dir)``; every Slurm task (or submitit-local process)
unpickles it — without importing torch, so login nodes and submitters never need it — and calls it.
The call installs our preemption handler in every rank first (replacing submitit's rank-0-only one),
then runs training in this task (:func:`hpc_train.rank.lifecycle.run`, the lifecycle every entrypoint shares)
and returns a small summary. Anything but a finished run does not return: submitit would record a result
for an instance that did not finish, so the call raises ``SystemExit`` with the rank's exit code (0 for a
requeued run, 75 checkpointed but not requeued, 2 bad configuration or data, 1 a crash).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..runs import rundir


def _exit_quietly_after_submitit() -> None:
    """Under submitit's ``_submit``, once training succeeded: end the process with code 0 right after
    submitit has written the result (atexit runs then), skipping C++ static destructors — torch's
    process-group threads torn down at interpreter exit have aborted ranks of finished jobs. Only there:
    an in-process caller (a test) keeps its own exit code."""
    import atexit
    import sys

    from .lifecycle import exit_now

    if os.environ.get("SUBMITIT_EXECUTOR") in ("slurm", "local") and "submitit" in " ".join(sys.argv):
        atexit.register(exit_now, 0)


class TrainJob:
    """Run one rank of a job.

    ``config_yaml``: the resolved job as YAML text (what ``hpc_train.config.dump_yaml`` writes), or the
    path of such a file. ``run_dir``: the run directory; empty means ``$HPC_TRAIN_RUN_DIR``, else
    ``<runs_dir>/<name>/local-<time>``.
    """

    def __init__(self, config_yaml: str, run_dir: str) -> None:
        self.config_yaml = config_yaml
        self.run_dir = run_dir

    def _spec(self):
        from ..config import spec_from_yaml_text

        text = self.config_yaml
        if "\n" not in text and text.strip() and os.path.isfile(text):
            path = Path(text)
            return spec_from_yaml_text(path.read_text(encoding="utf-8"), str(path)), path
        return spec_from_yaml_text(text, "TrainJob config"), None

    def __call__(self) -> dict[str, Any]:
        from . import lifecycle

        outcome = lifecycle.run(self._spec, run_dir=self.run_dir or None)
        if outcome.exit_code != 0 or outcome.summary.get("preempted"):
            # No result for submitit: a failed rank has said why (stderr, the run's state log) and leaves
            # with its exit code for srun; a preempted one with 0 (requeued) or 75.
            if outcome.summary.get("preempted"):
                print(outcome.message, flush=True)
            raise SystemExit(outcome.exit_code)
        summary = outcome.summary
        _exit_quietly_after_submitit()
        keep = ("run_dir", "dataset", "epochs", "global_step", "world_size", "group_sizes", "table")
        brief = {k: summary.get(k) for k in keep}
        for which in ("last", "best", "best_on_test", "tau_norm"):
            record = summary.get(which)
            brief[which] = None if record is None else {k: v for k, v in record.items() if k != "per_class"}
        return brief

    def __repr__(self) -> str:
        return f"TrainJob(run_dir={self.run_dir!r})"


class CommandJob(TrainJob):
    """The submitit callable of a job that runs the user's command (``submit -- CMD``): this task becomes the
    command (:mod:`hpc_train.command`), so submitit records no result; the run directory and the exit code
    say how it ended."""

    def __call__(self) -> dict[str, Any]:
        from . import command

        run_dir = Path(self.run_dir or os.environ.get(rundir.RUN_DIR_ENV, "."))
        raise SystemExit(command.start(lambda: self._spec()[0], run_dir))


class TorchrunJob(TrainJob):
    """The submitit callable of the ``torchrun`` launcher: one per node, it runs torchrun, whose workers
    are the ranks.

    This process only waits. It ignores the preemption signal (the workers get it from Slurm, or from
    the batch shell's forwarding ``scancel``, and act on it), and it must not keep submitit's handler,
    which would requeue from here. The rendezvous comes from the batch shell (``MASTER_ADDR``,
    ``MASTER_PORT``) and the job file from the run directory it wrote (``$HPC_TRAIN_RUN_DIR/job.yaml``).
    """

    def __call__(self) -> dict[str, Any]:
        import json
        import signal
        import subprocess
        import sys

        from . import preempt

        spec, _ = self._spec()
        for name in {spec.slurm.signal, "USR2"}:
            signal.signal(preempt.signal_number(name), signal.SIG_IGN)  # inherited by torchrun and its workers
        env = os.environ
        run_dir = Path(self.run_dir or env.get(rundir.RUN_DIR_ENV, ""))
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_NUM_NODES", "SLURM_JOB_ID") if not env.get(k)]
        if missing or not (run_dir / rundir.JOB_YAML).is_file():
            raise RuntimeError(f"the torchrun launcher needs the batch shell's {', '.join(missing) or 'job.yaml'}: "
                               "submit it with hpc-train (its sbatch template sets them)")
        command = [
            sys.executable, "-u", "-m", "torch.distributed.run",
            f"--nnodes={env['SLURM_JOB_NUM_NODES']}", f"--nproc-per-node={spec.slurm.ranks_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={env['MASTER_ADDR']}:{env['MASTER_PORT']}",
            f"--rdzv-id={env['SLURM_JOB_ID']}", "--max-restarts=0",
            "-m", "hpc_train.command" if spec.command else "hpc_train.train", "--resolved", str(run_dir / rundir.JOB_YAML),
        ]
        returncode = subprocess.run(command, check=False).returncode
        state = rundir.read_state(run_dir).state
        if state == rundir.REQUEUED:
            raise SystemExit(rundir.EXIT_OK)
        if state == rundir.PREEMPTED:
            raise SystemExit(rundir.EXIT_CHECKPOINTED)
        if returncode != 0:  # the workers have said why in this log; srun gets torchrun's code
            print(f"hpc-train: torchrun exited with status {returncode} on {env.get('SLURMD_NODENAME', '?')}",
                  file=sys.stderr, flush=True)
            raise SystemExit(returncode)
        try:
            summary = json.loads((run_dir / rundir.SUMMARY).read_text())
        except (OSError, ValueError):
            summary = {}
        return {k: summary.get(k) for k in ("run_dir", "dataset", "epochs", "global_step", "world_size")}
