"""The detached runner of local runs, ``python -m hpc_train.local PLAN`` (a local submit's launches, one
after another or ``slurm.pack`` at a time), and the same runner inside one Slurm array task of a packed
sweep, ``python -m hpc_train.local --pack RUN_DIR...`` (``--pack K``). Torch-free.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Sequence

from ..rank import preempt
from ..runs import launch_lock, rundir
from . import launcher


def run_pack(run_dirs: Sequence[Path]) -> int:
    """``python -m hpc_train.local --pack RUN_DIR...``: one Slurm array task of a packed sweep. Its points run
    together, each its own run; those already completed, failed or cancelled (a requeued task) are skipped.
    The points do not requeue themselves: once all have ended, a point that checkpointed on the signal
    (exit 75) requeues the task, at most ``slurm.max_requeues`` times, and every point resumes."""
    from ..config import read_text_file, spec_from_yaml_text

    specs = [spec_from_yaml_text(read_text_file(d / rundir.JOB_YAML), str(d / rundir.JOB_YAML)) for d in run_dirs]
    todo = [(s, d) for s, d in zip(specs, run_dirs)
            if rundir.read_state(d).state not in (rundir.COMPLETED, rundir.FAILED, rundir.CANCELLED)]
    s = specs[0].slurm
    launcher.forward_signals([s.signal, "TERM"])
    launches = [launcher.launch_for(spec, d, under_slurm=True) for spec, d in todo]
    codes = launcher.run_launches(launches, sys.executable, os.getcwd(), pack=len(launches))
    stopped = [d for (_, d), code in zip(todo, codes) if code == rundir.EXIT_CHECKPOINTED]
    if not stopped:
        return max([c for c in codes if c != 0] or [0])
    decision = preempt.decide_requeue(requeue_enabled=s.requeue, max_requeues=s.max_requeues,
                                      by_requeue_signal=s.signal in launcher.received())
    if decision.requeue and decision.job_id:
        ok, message = preempt.requeue(decision.job_id)
        print(f"hpc-train: {len(stopped)} packed run(s) checkpointed; {message}", flush=True)
        if ok:
            for run_dir in stopped:
                instance, restart = rundir.instance_of()
                rundir.append_event(run_dir, rundir.REQUEUED, writer="launcher", instance=instance,
                                    restart=restart, reason=message)
            return rundir.EXIT_OK
    print(f"hpc-train: {len(stopped)} packed run(s) checkpointed, not requeued: {decision.reason}", flush=True)
    return rundir.EXIT_CHECKPOINTED


def main(argv: list[str] | None = None) -> int:
    """``python -m hpc_train.local PLAN`` (a local submit's launches) or ``--pack RUN_DIR...`` (a packed Slurm
    array task); nothing else reads argv."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--pack":
        return run_pack([Path(a) for a in args[1:]])
    if len(args) != 1:  # internal, but said in one line as any bad input is
        print("usage: python -m hpc_train.local PLAN.json | --pack RUN_DIR...  (hpc-train submit --cluster local "
              "writes the plan and runs this)", file=sys.stderr)
        return rundir.EXIT_BAD_INPUT
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    for fd, run_id in plan.get("locks", []):  # handed over by submit, held until this process ends
        os.set_inheritable(fd, False)  # never a rank's or the guard's
        launch_lock.note_holder(fd, os.getpid(), run_id)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal does not end the runs (Slurm's do not)
    launcher.stop_on_signals()  # SIGTERM, SIGINT: end the ranks as scancel does, record the runs cancelled
    launches = [launcher.Launch(**item) for item in plan["launches"]]
    codes = launcher.run_launches(launches, plan["python"], plan["cwd"], pack=int(plan.get("pack", 1)))
    Path(args[0]).unlink(missing_ok=True)
    return codes[-1] if codes else 0
