"""Local runs (``--cluster local``, or ``auto`` without ``sbatch``): the sbatch script's counterpart on
one machine, so the embedded default does what Slurm does.

:func:`submit_local` writes every run directory and a plan, then starts one detached runner,
``python -m hpc_train.local PLAN`` (:mod:`.runner`), which runs the plan's launches (:mod:`.launcher`) one
after another, or ``slurm.pack`` at a time (a sweep point each, or the same run again for ``--chain``;
``--resume`` is a launch of an existing run).

What only a cluster has (modules, venv, containers, partitions) is ignored, and said so.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from ..config.command_paths import check_found_here
from ..errors import ConfigError
from ..runs import launch_lock, rundir, safe_files
from ..runs.liveness import RUNNER_MODULE
from . import launcher


# --------------------------------------------------------------------------------------------------
# The submit side: run directories, the plan, the detached launcher
# --------------------------------------------------------------------------------------------------

def ignored_keys(spec) -> list[str]:
    """The slurm.* keys set away from their defaults that a local run cannot honour."""
    from ..config.slurm_options import ignored_locally

    requeues = bool(spec.command) or spec.slurm.hang_action == "requeue"  # a local command or hang is launched again
    return [f"slurm.{key}" for key in ignored_locally(spec.slurm, relaunches=requeues)]


def local_note(spec) -> str:
    ignored = ignored_keys(spec)
    if not ignored:
        return ""
    applied = ", slurm.env applied" if spec.slurm.env else ""
    return (f"running locally: {', '.join(ignored)} ignored (the ranks run {sys.executable} in this "
            f"environment{applied})")


def visible_gpus() -> int:
    """NVIDIA GPUs this machine has (the driver's /proc entries, else the device files), without CUDA or torch."""
    driver = Path("/proc/driver/nvidia/gpus")
    found = len(list(driver.iterdir())) if driver.is_dir() else 0
    return max(found, len([p for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit()]))


def check_devices(spec) -> None:
    """Before any rank starts (the torch import alone takes seconds): a trainer job that asks for GPUs runs on
    this machine only where it has them (never a silent CPU fallback: docs/design.md, decision 10)."""
    t, s = spec.train, spec.slurm
    wants_cuda = t.device == "cuda" or (t.device == "auto" and s.gpus_per_node > 0)
    if spec.command or not wants_cuda:
        return
    have = visible_gpus()
    wanted = max(1, s.gpus_per_node)
    if have < wanted:
        why = "train.device=cuda" if t.device == "cuda" else f"--gpus {s.gpus_per_node} (slurm.gpus_per_node)"
        raise ConfigError(f"{why} asks for {wanted} GPU(s), but this machine has {have}; run it locally with --gpus 0 "
                          "(CPU ranks, gloo) or --set train.device=cpu, or submit it to a cluster with GPUs")


def plan_text(resolved, run_dirs: Sequence[Path]) -> str:
    """What a local submit would run (``submit --dry-run`` without Slurm), written nowhere."""
    lines = []
    for spec, run_dir in zip(resolved.sweep or [resolved.spec], run_dirs):
        s = spec.slurm
        lines.append(f"# {spec.name}: {s.ranks_per_node} local rank(s) in {run_dir}, time limit {s.time} "
                     f"(SIG{s.signal} {s.signal_delay_s} s before it)")
        for key, value in sorted(s.env.items()):
            lines.append(f"export {key}={shlex.quote(value)}")
        job_yaml = shlex.quote(str(run_dir / rundir.JOB_YAML))
        entry = launcher.launch_for(spec, run_dir).entry
        if spec.command:
            lines.append(f"# every rank becomes: {shlex.join(spec.command)}")
        for rank in range(s.ranks_per_node):
            log = shlex.quote(str(run_dir / rundir.RANK_LOG.format(rank=rank)))
            lines.append(f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE={s.ranks_per_node} MASTER_ADDR=127.0.0.1 "
                         f"{shlex.quote(sys.executable)} -u -m {entry} --resolved {job_yaml} > {log}")
    return "\n".join(lines) + "\n"


def new_run_ids(count: int) -> list[str]:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"local-{stamp}-{os.getpid()}"
    return [base] if count == 1 else [f"{base}_{i}" for i in range(count)]


def submit_local(resolved, *, cwd: Path | None = None, resume_dir: Path | None = None, chain: int = 1,
                 note: str = "", snapshot: dict[str, str] | None = None, locks: Sequence[int] = ()):
    """Write the run directories and start the local launcher; returns at once (like sbatch). The runner is handed
    the launch lock of every run it launches (``locks``: the continued run's, taken by the caller; a new run's,
    taken here) and holds it until its last launch ended (:mod:`hpc_train.runs.launch_lock`)."""
    from ..config import dump_yaml
    from ..runs.submission import SubmitResult, continue_run_record, run_record, submission_facts, write_run_files
    from ..runs.undo import Created

    cwd = (cwd or Path.cwd()).resolve()
    specs = list(resolved.sweep or [resolved.spec])
    spec = specs[0]
    check_devices(spec)
    check_found_here(spec, spec.slurm.env.get("PATH", os.environ.get("PATH")))  # the ranks' PATH: exit 2 now, not 127
    group = rundir.run_group(rundir.runs_root(spec.runs_dir, cwd), spec.name)
    created = Created()
    created.mkdir(group)
    taken: list[int] = []  # the new runs' locks (the caller closes its own)
    try:
        if resume_dir is not None:
            run_dirs = [resume_dir]
            created.write(resume_dir / rundir.JOB_YAML, dump_yaml(spec))  # --set may change the continued run
            continue_run_record(resume_dir, resume_dir.name, rundir.own_logs(resume_dir))
        else:
            run_dirs = [group / run_id for run_id in new_run_ids(len(specs))]
            facts = submission_facts()
            for task_spec, run_dir in zip(specs, run_dirs):
                record = run_record(task_spec, resolved.sources, run_dir, job_id=run_dir.name, cluster="local",
                                    logs=rundir.own_logs(run_dir), submission=facts)
                write_run_files(created, run_dir, task_spec, record, snapshot=snapshot)
                taken.append(launch_lock.take(run_dir, f"{task_spec.name}/{run_dir.name}", run_dir.name).fd)
        held = list(locks) + taken
        launches = [launcher.as_dict(launcher.launch_for(s, d)) for s, d in zip(specs, run_dirs)]
        launches += [launches[-1]] * (chain - 1)  # a chain: the same run again, resuming
        plan = group / f".local-plan-{run_dirs[0].name}.json"
        created.write(plan, json.dumps({"launches": launches, "python": sys.executable, "cwd": str(cwd),
                                        # pack packs sweep points: a chain's launches of one run never overlap
                                        "pack": spec.slurm.pack if len(run_dirs) > 1 else 1,
                                        "locks": [[fd, d.name] for fd, d in zip(held, run_dirs)]}))
        with os.fdopen(safe_files.open_append(run_dirs[0] / rundir.BATCH_LOG, within=run_dirs[0]), "a",
                       encoding="utf-8") as launcher_log:  # never through a planted symlink
            proc = subprocess.Popen([sys.executable, "-m", RUNNER_MODULE, str(plan)], cwd=cwd,
                                    stdin=subprocess.DEVNULL, stdout=launcher_log, stderr=subprocess.STDOUT,
                                    start_new_session=True,  # not ended by the terminal, like a Slurm job
                                    pass_fds=held)  # the locks: the runner holds them from here on
    except BaseException:
        created.undo()
        raise
    finally:
        for fd in taken:
            os.close(fd)
    for run_dir in run_dirs:
        _note_launcher(run_dir, proc.pid)
    together = f"{spec.slurm.pack} at a time" if spec.slurm.pack > 1 else "one after another"
    notes = [n for n in (note, local_note(spec),
                         f"{len(run_dirs)} local runs, {together}" if len(run_dirs) > 1 else "",
                         f"a chain of {chain} local launches of {run_dirs[0].name}" if chain > 1 else "") if n]
    first = run_dirs[0]
    # A sweep is named as a whole, as a Slurm array is (NAME/<id>_*): status, cancel and --wait act on every point.
    ident = first.name.rsplit("_", 1)[0] if len(run_dirs) > 1 else first.name
    shown = f"{ident}_*" if len(run_dirs) > 1 else ident
    return SubmitResult(job_id=ident, run_name=f"{spec.name}/{shown}", run_dir=str(first), cluster="local",
                        note="; ".join(notes), tasks=tuple(d.name for d in run_dirs) if len(run_dirs) > 1 else (),
                        run_dirs=tuple(str(d) for d in run_dirs))


def _note_launcher(run_dir: Path, pid: int) -> None:
    path = run_dir / rundir.RUN_JSON
    record = json.loads(path.read_text(encoding="utf-8"))
    rundir.write_json_atomic(path, {**record, "launcher_pid": pid})
