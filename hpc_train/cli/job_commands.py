"""render, submit, simulate, train: the commands that work on a job."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError
from .group import CONTEXT, cli
from .options import (WithCommand, echo_json, job_options, resolve, runs_root, simulate_options, sweep_options,
                      write_output)


@cli.command(cls=WithCommand, context_settings=CONTEXT)
@job_options
@sweep_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the script to FILE instead of printing it.")
def render(output: Path | None, **kwargs: Any) -> None:
    """Print the complete sbatch script for a job (no Slurm needed). After `--`: your own command, which
    every rank runs instead of the trainer (see `submit --help`).

    The script is self-contained: it carries the fully resolved job, creates the run directory from
    $SLURM_JOB_ID and launches every rank with `python -m hpc_train.train`; `sbatch` it by hand to run
    the same job as `submit` (same resources, environment and training). `submit` renders the same
    template with submitit's launch line and log paths instead, so submitit can track the job.

    \b
    Examples:
      hpc-train render --nodes 4 --gpus 8
      hpc-train render jobs/cifar10_lt_ldam_drw.yaml --set slurm.partition=a100 -o job.sbatch
    """
    from ..render.plain import render_plain

    resolved = resolve(kwargs)
    spec = resolved.spec
    script = render_plain(spec, resolved.sources, sweep=resolved.sweep, max_parallel=kwargs.get("max_parallel"))
    if output is None:
        click.echo(script, nl=False)
        return
    write_output(output, script)
    click.echo(f"wrote {output} ({spec.slurm.nodes} node(s) x {spec.slurm.ranks_per_node} rank(s)); "
               f"submit it with: sbatch {output}", err=True)


@dataclass
class DryRun:
    """What ``submit --dry-run`` found, doing nothing: printed as text (the script or plan on stdout, the rest on
    stderr) or, with ``--json``, as one JSON object of these fields."""

    cluster: str
    plugins: list[str] = field(default_factory=list)
    script: str | None = None
    """The sbatch script (Slurm), or the local ranks' command lines (local)."""
    notes: list[str] = field(default_factory=list)
    preflight: list[str] = field(default_factory=list)

    def show(self, as_json: bool) -> None:
        if as_json:
            echo_json({"dry_run": True, **dataclasses.asdict(self)})
            return
        for line in self.plugins:
            click.echo(line, err=True)
        if self.script is not None:
            click.echo(self.script, nl=False)
        for line in self.notes + [f"preflight: {line}" for line in self.preflight]:
            click.echo(line, err=True)


def _dry_run(resolved: Any, cluster: str, resume_dir: Path | None, max_parallel: int | None) -> DryRun:
    """What submit would do, doing nothing: the local plan, or the Slurm script and Slurm's verdict (without
    Slurm here: the script and the checks this machine can make, the verdict skipped, exit 0)."""
    import shutil

    from ..config import dump_yaml
    from ..config.plugins import in_use
    from ..front.submit import choose_cluster
    from ..plugin_child import probe_in_child
    from ..slurm import queue as slurm_queue

    spec = resolved.spec
    no_slurm = shutil.which("sbatch") is None
    slurm_script_here = no_slurm and (cluster == "slurm" or (cluster == "auto" and _only_a_cluster_can(spec)))
    chosen, note = ("slurm", "") if slurm_script_here else choose_cluster(cluster, spec)  # type: ignore[arg-type]
    # The job's own modules are imported in a child with a deadline: one that exits, hangs or leaves a thread at
    # import is exit 2 saying so, not the end or the hang of this process.
    plugins = [] if spec.command or not in_use(spec.train) else probe_in_child(dump_yaml(spec))
    if chosen == "local":
        return _local_plan(resolved, resume_dir, note, plugins)
    spec, sweep = slurm_queue.with_site_gpu_flag(resolved)
    script = slurm_queue.dry_run_script(spec, resolved.sources, sweep=sweep, max_parallel=max_parallel,
                                       resume_dir=resume_dir)
    if slurm_script_here:
        return DryRun("slurm", plugins, script, notes=["no Slurm here: sbatch --test-only skipped"])
    return DryRun("slurm", plugins, script, preflight=list(slurm_queue.preflight(spec, script)))


def _only_a_cluster_can(spec: Any) -> bool:
    """A job this machine cannot run (more than one node, or GPUs it lacks): its dry run without Slurm shows the
    Slurm script, as on a laptop a user prepares a cluster job on (a real local submit is still refused)."""
    from ..errors import ConfigError
    from ..local import plan as local

    if spec.slurm.nodes > 1:
        return True
    try:
        local.check_devices(spec)
    except ConfigError:
        return True
    return False


def _local_plan(resolved: Any, resume_dir: Path | None, note: str, plugins: list[str]) -> DryRun:
    from ..local import plan as local
    from ..runs import rundir

    spec = resolved.spec
    local.check_devices(spec)
    group = rundir.run_group(rundir.runs_root(spec.runs_dir), spec.name)
    run_dirs = [resume_dir] if resume_dir else [group / rid for rid in local.new_run_ids(len(resolved.sweep) or 1)]
    together = f"{spec.slurm.pack} at a time" if spec.slurm.pack > 1 else "one after another"
    summary = (f"dry run: would run {spec.slurm.ranks_per_node} local rank(s) of {spec.name!r} "
               f"{'in ' + str(len(run_dirs)) + ' runs, ' + together if len(run_dirs) > 1 else ''}").rstrip()
    notes = [line for line in (note, local.local_note(spec)) if line] + [summary]
    return DryRun("local", plugins, local.plan_text(resolved, run_dirs), notes=notes)


@cli.command(cls=WithCommand, context_settings=CONTEXT)
@job_options
@sweep_options
@click.option("--cluster", type=click.Choice(["auto", "slurm", "local"]), default="auto", show_default=True,
              envvar="HPC_TRAIN_CLUSTER", show_envvar=True,
              help="slurm: sbatch through submitit; local: processes on this machine; auto: slurm if sbatch is on PATH.")
@click.option("--resume", "resume", metavar="RUN", help="Continue RUN (name/id, job id or path) in a new job; refused "
              "while a launch of it is live, and when --set would change what its checkpoints hold.")
@click.option("--chain", type=click.IntRange(min=1, max=100), default=1, show_default=True,
              help="Queue N jobs, each starting after the previous ends and resuming the same run (no requeue needed).")
@click.option("--dry-run", is_flag=True, help="Submit nothing; print what would run. Slurm: the script and Slurm's "
              "verdict (partition, account, sbatch --test-only); without Slurm here, the script and the checks this "
              "machine can make. Local: each rank's command line.")
@click.option("--wait", is_flag=True, help="Follow the run(s) to the end; exit 0 only if they completed.")
@click.option("--json", "as_json", is_flag=True, help="Print job id, run name and run dir as JSON (with --dry-run: what would run, as JSON).")
@click.option("--snapshot", is_flag=True, help="Record the code that runs: the git SHA, branch and untracked files "
              "(code.json) and the uncommitted `git diff HEAD` (code.diff) of the submit directory, in each run.")
def submit(cluster: str, resume: str | None, chain: int, dry_run: bool, wait: bool, as_json: bool, snapshot: bool,
           **kwargs: Any) -> None:
    """Submit a job: to Slurm through submitit, or as local processes.

    Returns at once with the job id and run name (use --wait to follow the job). Without Slurm, the
    job runs on this machine: `--gpus 0 --tasks-per-node N` runs N DDP ranks on CPUs (gloo); sweeps,
    --resume and --chain run one after another (--pack K: K at a time).

    After `--`, your own command: every rank runs it exactly as typed, with RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and HPC_TRAIN_RUN_DIR set, the same run directory, logs,
    status and preemption (exit 75 after checkpointing on the signal: requeued; docs/commands.md). It runs in
    the run's own <run dir>/work (--workdir run, the default: a new run never finds another run's files; a
    relative program or `python SCRIPT` still means the submit directory's, checked now: exit 2 if missing),
    or with --workdir submit in the submit directory, shared by every run started there.

    \b
    Examples:
      hpc-train submit --nodes 2 --gpus 4 -- python train.py --lr 0.1
      hpc-train submit --nodes 2 --gpus 4 -- hpc-train env   # what every rank sees
      hpc-train submit --nodes 4 --gpus 8 jobs/cifar100_lt_bs.yaml
      hpc-train submit --cluster local --wait            # the demo job, 2 local DDP ranks
      hpc-train submit jobs/cifar100_lt_bs.yaml --dry-run     # script + sbatch --test-only
      hpc-train submit JOB.yaml --sweep train.loss.name=ce,balanced_softmax --max-parallel 1
      hpc-train submit --resume cifar10-lt/4242 --chain 3
    """
    from ..config.command_paths import check_in_submit_dir
    from ..front.follow import stream_rank0, wait_for
    from ..runs.status_lines import completed_message
    from ..front.submit import submit as submit_job
    from ..runs.status import log_sizes

    logged_before: dict[Path, int] = {}
    if resume is not None:
        if kwargs.get("job"):
            raise ConfigError("give either JOB or --resume RUN (a resumed run keeps its own job)")
        if kwargs.get("sweeps") or kwargs.get("sweep_file"):
            raise ConfigError("--resume continues one run; it takes no --sweep")
    lock = None
    try:
        run, job_file, lock = _continued_run(resume, kwargs.get("runs_dir"), lock=not dry_run) \
            if resume is not None else (None, None, None)
        resume_dir = run.run_dir if run is not None else None
        resolved = resolve(kwargs, job_file)
        if run is not None:
            _check_same_submit_dir(run.record, resolved.spec)
        check_in_submit_dir(resolved.spec, Path.cwd())  # a relative program or script after --: exit 2 now
        if resume_dir is not None and job_file is not None:
            _check_continuation(resume_dir, job_file, resolved)
        if dry_run:
            _dry_run(resolved, cluster, resume_dir, kwargs.get("max_parallel")).show(as_json)
            return
        if run is not None:
            logged_before = log_sizes(run, 0)  # --wait prints what this launch adds, not the earlier launches' log
        result = submit_job(resolved, cluster=cluster, max_parallel=kwargs.get("max_parallel"),  # type: ignore[arg-type]
                            resume_dir=resume_dir, chain=chain, snapshot=snapshot, locks=[lock.fd] if lock else [])
    except BaseException:
        if lock is not None:  # refused after all: the lock file says what it said before
            lock.give_up()
        raise
    if lock is not None:
        os.close(lock.fd)  # a local runner holds it now; a Slurm run's record says it is queued
    from ..runs.submission import shared_filesystem_warning

    warning = shared_filesystem_warning(Path(result.run_dir)) if result.cluster == "slurm" else None
    for line in ([f"warning: {warning}"] if warning else []) + ([result.note] if result.note else []):
        if not as_json:
            click.echo(line, err=True)
    if as_json:
        click.echo(result.to_json())
    else:
        click.echo(f"submitted {result.run_name} (job {result.job_id}, {result.cluster}); run dir {result.run_dir}")
    if wait:
        try:
            if not as_json:
                stream_rank0(result, click.echo, since=logged_before)
            ended = wait_for(result)
        except KeyboardInterrupt:
            click.echo(f"stopped following {result.run_name}; it goes on (hpc-train status / hpc-train cancel "
                       f"{result.run_name})", err=True)
            sys.exit(130)
        if not as_json:
            click.echo(completed_message(result.run_name, ended))


def _continued_run(selector: str, runs_dir: str | None, *, lock: bool) -> tuple[Any, Path, Any]:
    """``--resume RUN``: the run and its job file, once no launch of it is live (exit 2 naming the job that is,
    and the pid that holds its launch lock). ``lock`` (not for a dry run): checked under the run's launch lock,
    returned held (:mod:`hpc_train.runs.launch_lock`)."""
    from ..front.status import run_state
    from ..runs import launch_lock
    from ..runs.index import resolve_run
    from ..runs.submission import continued_job_file, resumable

    run = resolve_run(selector, runs_root(runs_dir))
    held = launch_lock.take(run.run_dir, run.name, run.job_id) if lock else None
    try:
        state, reason = run_state(run)  # the state alone: no metrics or logs read
        resumable(run.name, run.job_id, state, reason)
        return run, continued_job_file(run.run_dir), held
    except BaseException:
        if held is not None:
            held.give_up()
        raise


def _check_continuation(run_dir: Path, job_file: Path, resolved: Any) -> None:
    """Before anything is written: a --resume keeps what the run's checkpoints hold (runs.submission)."""
    from ..config import read_text_file, spec_from_yaml_text
    from ..runs.submission import check_continuation

    old = spec_from_yaml_text(read_text_file(job_file), str(job_file))
    check_continuation(f"{old.name}/{run_dir.name}", old, resolved.spec)


def _check_same_submit_dir(record: Any, spec: Any) -> None:
    """A command's relative program or script, and ``workdir: submit``, mean the submit directory's files: resumed
    from another directory they would silently mean others (``record``: the run's run.json, which keeps where the
    run was submitted)."""
    from ..config.command_paths import relative_paths

    if not spec.command or not (relative_paths(tuple(spec.command)) or spec.workdir == "submit"):
        return
    submitted_in = record.get("submit_dir")
    if isinstance(submitted_in, str) and Path(submitted_in).resolve() != Path.cwd().resolve():
        raise ConfigError(f"--resume from {Path.cwd()}: this run was submitted from {submitted_in}, and its command's "
                          f"relative paths mean files there; resume it from {submitted_in}")


@cli.command(context_settings=CONTEXT)
@simulate_options
@click.option("--nodelist", help="The allocation's node list (default: node[01-N]).")
@click.option("--job-id", type=click.IntRange(min=1, max=2**31 - 1), default=1234, show_default=True,
              help="Job id the MASTER_PORT is derived from.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def simulate(nodelist: str | None, job_id: int, as_json: bool, **kwargs: Any) -> None:
    """Show the RANK / LOCAL_RANK / NODE_RANK / MASTER_* every rank of an allocation would get.

    It runs the rank mapping the tasks run (hpc_train.dist.DistEnv) on Slurm-shaped environments.

    \b
    Example:
      hpc-train simulate --nodes 2 --gpus 4 --nodelist 'gpu[01-02]'
    """
    from ..rank.dist import simulate as simulate_ranks

    s = resolve(kwargs).spec.slurm
    nodelist = nodelist or (f"node[01-{s.nodes:02d}]" if s.nodes > 1 else "node01")
    envs = simulate_ranks(nodelist, nodes=s.nodes, ranks_per_node=s.ranks_per_node, job_id=job_id,
                          port_base=s.master_port_base, port_span=s.master_port_span)
    keys = ["rank", "local_rank", "node_rank", "world_size", "local_world_size", "host", "master_addr", "master_port"]
    rows = [dict(zip(keys, (d.rank, d.local_rank, d.node_rank, d.world_size, d.local_world_size, d.hostname,
                            d.master_addr, d.master_port))) for d in envs]
    if as_json:
        echo_json(rows)
        return
    shown = [k for k in keys if k != "local_world_size"]
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in shown]
    click.echo("  ".join(k.upper().ljust(w) for k, w in zip(shown, widths)).rstrip())
    for row in rows:
        click.echo("  ".join(str(row[k]).ljust(w) for k, w in zip(shown, widths)).rstrip())


@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def train(train_args: tuple[str, ...]) -> None:
    """Run the training entrypoint in this process (under srun, torchrun, or alone).

    This is `python -m hpc_train.train` (the same process lifecycle the ranks of a job have):
    JOB [--set KEY=VALUE]... [--epochs N] [--dry-run] [--run-dir DIR]; JOB is a job file or a shipped
    example name.

    \b
    Examples:
      hpc-train train digits_lt_demo --epochs 2          # the recipe shortened, warm-up and milestones with it
      hpc-train train jobs/cifar10_lt_ldam_drw.yaml --dry-run --set train.data.root=/data/cifar
      hpc-train train jobs/cifar10_lt_ldam_drw.yaml --epochs 3 --set train.data.root=/data/cifar
    """
    from ..rank.interpreter import same_interpreter

    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, same_interpreter("-m", "hpc_train.train", *train_args))
