"""The ``hpc-train`` command line: parsing and printing only.

Work happens in typed functions (config, render, submit, dist, provision); their one error family,
:class:`~hpc_train.errors.HpcTrainError`, becomes a click error here, in one place (``_Group.invoke``):
a one- or two-line message, exit 2 for usage/config errors and 1 for failed jobs, no traceback.
torch and submitit are imported inside the commands that need them, never at import time.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__
from .errors import ConfigError, HpcTrainError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _CliError(click.ClickException):
    def __init__(self, exc: HpcTrainError) -> None:
        super().__init__(str(exc))
        self.exit_code = exc.exit_code


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HpcTrainError as exc:
            raise _CliError(exc) from None


@click.group(cls=_Group, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="hpc-train")
def cli() -> None:
    """Train PyTorch long-tail classifiers with DDP on Slurm GPU clusters.

    \b
    hpc-train render --nodes 4 --gpus 8           print the sbatch script (no Slurm needed)
    hpc-train submit --nodes 4 --gpus 8 JOB.yaml  submit it (through submitit)
    hpc-train submit                              the built-in demo job, locally if no Slurm
    hpc-train simulate --nodes 2 --gpus 4 --nodelist 'gpu[01-02]'

    JOB is a YAML job file (see `hpc-train jobs list`) or the name of a shipped example job;
    without JOB the built-in default job (jobs/digits_lt_demo.yaml) is used. Exit codes: 0 ok,
    1 the job failed, 2 bad usage or configuration.
    """


# ------------------------------------------------------------------------------------------------
# Shared job options
# ------------------------------------------------------------------------------------------------

_FLAG_KEYS = {
    "nodes": "slurm.nodes",
    "gpus": "slurm.gpus_per_node",
    "tasks_per_node": "slurm.tasks_per_node",
    "launcher": "slurm.launcher",
    "time": "slurm.time",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "name": "name",
    "runs_dir": "runs_dir",
}


def job_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("job", required=False, metavar="[JOB]"),
        click.option("--nodes", "-N", type=click.IntRange(min=1), envvar="HPC_TRAIN_NODES", show_envvar=True,
                     help="Number of nodes."),
        click.option("--gpus", "-G", type=click.IntRange(min=0), envvar="HPC_TRAIN_GPUS", show_envvar=True,
                     help="GPUs per node; implies one rank per GPU unless --tasks-per-node is given."),
        click.option("--tasks-per-node", type=click.IntRange(min=1), help="Ranks per node (CPU jobs; default: one per GPU)."),
        click.option("--launcher", type=click.Choice(["srun", "torchrun"]), help="Launch block: srun (one task per rank) or torchrun (one per node)."),
        click.option("--time", "-t", help="Time limit, Slurm format (e.g. 02:00:00, 1-00:00)."),
        click.option("--partition", "-p", envvar="HPC_TRAIN_PARTITION", show_envvar=True, help="Slurm partition."),
        click.option("--account", "-A", envvar="HPC_TRAIN_ACCOUNT", show_envvar=True, help="Slurm account."),
        click.option("--name", help="Job name (also the run-directory group)."),
        click.option("--runs-dir", envvar="HPC_TRAIN_RUNS_DIR", show_envvar=True,
                     help="Where run directories go (default: ./runs)."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Override any job key, value read as YAML (e.g. --set train.epochs=10). Repeatable."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _resolve(kwargs: dict[str, Any], job: str | Path | None = None):
    """The job a command works on (site file, job file, --set, flags and any sweep), through config.resolve."""
    from .config import resolve

    flags = {key: kwargs.get(opt) for opt, key in _FLAG_KEYS.items()}
    return resolve(job if job is not None else kwargs.get("job"), sets=kwargs.get("sets", ()), flags=flags,
                   sweeps=kwargs.get("sweeps", ()), sweep_file=kwargs.get("sweep_file"))


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def sweep_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
                     help="One job-array task per value (several --sweep: their grid). train.* keys only."),
        click.option("--sweep-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="YAML sweep: {key: [values]} (grid) or {points: [{key: value}, ...]}."),
        click.option("--max-parallel", type=click.IntRange(min=1), help="Array throttle: at most N tasks at once (%N)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


# ------------------------------------------------------------------------------------------------
# render / submit / simulate / train
# ------------------------------------------------------------------------------------------------


@cli.command(context_settings=CONTEXT)
@job_options
@sweep_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the script to FILE instead of printing it.")
def render(output: Path | None, **kwargs: Any) -> None:
    """Print the complete sbatch script for a job (no Slurm needed).

    The script is self-contained: it carries the fully resolved job, creates the run directory from
    $SLURM_JOB_ID and launches every rank; `sbatch` it by hand to run exactly what `submit` would.

    \b
    Examples:
      hpc-train render --nodes 4 --gpus 8
      hpc-train render jobs/cifar10_lt_ldam_drw.yaml --set slurm.partition=a100 -o job.sbatch
    """
    from .submit import render_plain

    resolved = _resolve(kwargs)
    spec = resolved.spec
    script = render_plain(spec, resolved.sources, sweep=resolved.sweep, max_parallel=kwargs.get("max_parallel"))
    if output is None:
        click.echo(script, nl=False)
    else:
        output.write_text(script, encoding="utf-8")
        click.echo(f"wrote {output} ({spec.slurm.nodes} node(s) x {spec.slurm.ranks_per_node} rank(s)); "
                   f"submit it with: sbatch {output}", err=True)


@cli.command(context_settings=CONTEXT)
@job_options
@sweep_options
@click.option("--cluster", type=click.Choice(["auto", "slurm", "local"]), default="auto", show_default=True,
              envvar="HPC_TRAIN_CLUSTER", show_envvar=True,
              help="slurm: sbatch through submitit; local: processes on this machine; auto: slurm if sbatch is on PATH.")
@click.option("--resume", "resume", metavar="RUN", help="Continue RUN (name/id, job id or path) in a new job.")
@click.option("--chain", type=click.IntRange(min=1), default=1, show_default=True,
              help="Queue N jobs, each starting after the previous ends and resuming the same run (no requeue needed).")
@click.option("--dry-run", is_flag=True, help="Print the script that would be submitted and, when Slurm is "
              "reachable, check it with sbatch --test-only; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job to its end; exit 0 only if it succeeded.")
@click.option("--json", "as_json", is_flag=True, help="Print job id, run name and run dir as JSON.")
def submit(cluster: str, resume: str | None, chain: int, dry_run: bool, wait: bool, as_json: bool,
           **kwargs: Any) -> None:
    """Submit a job: to Slurm through submitit, or as local processes.

    Returns at once with the job id and run name (use --wait to follow the job).
    Without Slurm, the job runs on this machine: `--gpus 0 --tasks-per-node N` runs N DDP ranks
    on CPUs (gloo).

    \b
    Examples:
      hpc-train submit --nodes 4 --gpus 8 jobs/cifar100_lt_balanced_softmax.yaml
      hpc-train submit --cluster local --wait            # the demo job, 2 local DDP ranks
      hpc-train submit JOB.yaml --dry-run                # script + sbatch --test-only
      hpc-train submit JOB.yaml --sweep train.loss.name=ce,balanced_softmax --max-parallel 1
      hpc-train submit --resume cifar10-lt/4242 --chain 3
    """
    from . import submit as submit_mod

    resume_dir = None
    job_file = None
    if resume:
        if kwargs.get("job"):
            raise ConfigError("give either JOB or --resume RUN (a resumed run keeps its own job)")
        run = submit_mod.resolve_run(resume, _runs_root(kwargs.get("runs_dir")))
        resume_dir, job_file = run.run_dir, submit_mod.continued_spec(run)
    resolved = _resolve(kwargs, job_file)
    spec, sources, sweep = resolved.spec, resolved.sources, list(resolved.sweep)
    max_parallel = kwargs.get("max_parallel")
    if dry_run:
        chosen, note = submit_mod.choose_cluster(cluster, spec)  # type: ignore[arg-type]
        if chosen == "local":
            click.echo(f"dry run: would run {spec.slurm.ranks_per_node} local rank(s) of {spec.name!r}"
                       + (f" ({note})" if note else ""), err=True)
            return
        spec = submit_mod.with_site_gpu_flag(spec)
        sweep = [submit_mod.with_site_gpu_flag(s) for s in sweep]
        script = submit_mod.dry_run_script(spec, sources, sweep=sweep, max_parallel=max_parallel,
                                           resume_dir=resume_dir)
        click.echo(script, nl=False)
        for line in submit_mod.preflight(spec, script):
            click.echo(f"preflight: {line}", err=True)
        return
    warning = submit_mod.shared_filesystem_warning(submit_mod.runs_root(spec))
    if warning and cluster != "local":
        click.echo(f"warning: {warning}", err=True)
    result = submit_mod.submit(spec, sources, cluster=cluster, sweep=sweep, max_parallel=max_parallel,  # type: ignore[arg-type]
                               resume_dir=resume_dir, chain=chain)
    if result.note and not as_json:
        click.echo(result.note, err=True)
    if as_json:
        click.echo(submit_mod.result_json(result))
    else:
        click.echo(f"submitted {result.run_name} (job {result.job_id}, {result.cluster}); run dir {result.run_dir}")
    if wait:
        if not as_json:
            submit_mod.stream_rank0(result, click.echo)
        submit_mod.wait_for(result)
        if not as_json:
            click.echo(f"job {result.job_id} finished successfully")


@cli.command(context_settings=CONTEXT)
@job_options
@click.option("--nodelist", help="The allocation's node list (default: node[01-N]).")
@click.option("--job-id", type=click.IntRange(min=1), default=1234, show_default=True,
              help="Job id the MASTER_PORT is derived from.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def simulate(nodelist: str | None, job_id: int, as_json: bool, **kwargs: Any) -> None:
    """Show the RANK / LOCAL_RANK / NODE_RANK / MASTER_* every rank of an allocation would get.

    It runs the rank mapping the tasks run (hpc_train.dist.DistEnv) on Slurm-shaped environments.

    \b
    Example:
      hpc-train simulate --nodes 2 --gpus 4 --nodelist 'gpu[01-02]'
    """
    from .dist import simulate as simulate_ranks

    s = _resolve(kwargs).spec.slurm
    nodelist = nodelist or (f"node[01-{s.nodes:02d}]" if s.nodes > 1 else "node01")
    envs = simulate_ranks(nodelist, nodes=s.nodes, ranks_per_node=s.ranks_per_node, job_id=job_id,
                          port_base=s.master_port_base, port_span=s.master_port_span)
    rows = [
        {"rank": d.rank, "local_rank": d.local_rank, "node_rank": d.node_rank, "world_size": d.world_size,
         "local_world_size": d.local_world_size, "host": d.hostname, "master_addr": d.master_addr,
         "master_port": d.master_port}
        for d in envs
    ]
    if as_json:
        _echo_json(rows)
        return
    headers = ["RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "HOST", "MASTER_ADDR", "MASTER_PORT"]
    keys = ["rank", "local_rank", "node_rank", "world_size", "host", "master_addr", "master_port"]
    widths = [max(len(h), *(len(str(r[k])) for r in rows)) for h, k in zip(headers, keys)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in rows:
        click.echo("  ".join(str(row[k]).ljust(w) for k, w in zip(keys, widths)).rstrip())


@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def train(train_args: tuple[str, ...]) -> None:
    """Run the training entrypoint in this process (under srun, torchrun, or alone).

    Arguments go to `python -m hpc_train.train`: JOB [--set KEY=VALUE]... [--dry-run] [--run-dir DIR].

    \b
    Examples:
      hpc-train train jobs/digits_lt_demo.yaml --set train.epochs=2
      hpc-train train jobs/cifar10_lt_ldam_drw.yaml --dry-run --set train.data.root=/data/cifar
    """
    try:
        from .train.__main__ import main as train_main
    except ImportError as exc:
        raise ConfigError(f"the training code needs the 'train' extra ({exc.name} is missing): "
                          "pip install 'hpc-train[train]'") from None
    code = train_main(list(train_args))
    sys.exit(code)


# ------------------------------------------------------------------------------------------------
# Run lifecycle (filled by the Slurm lifecycle work)
# ------------------------------------------------------------------------------------------------


def _runs_root(runs_dir: str | None) -> Path:
    import os

    return Path(os.path.expanduser(runs_dir or "runs")).resolve()


_RUNS_DIR_OPTION = click.option("--runs-dir", envvar="HPC_TRAIN_RUNS_DIR", show_envvar=True,
                                help="Where run directories are (default: ./runs).")


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False)
@_RUNS_DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(run: str | None, runs_dir: str | None, as_json: bool) -> None:
    """Show the state of a run (or of every run under ./runs).

    RUN is a run name (name/id), a job id, a run directory, or a job name (its latest run). The state
    comes from squeue, then sacct; a failed run names its first failing rank and host.

    \b
    Examples:
      hpc-train status
      hpc-train status digits-lt-demo/4242 --json
    """
    from . import submit as submit_mod

    root = _runs_root(runs_dir)
    runs = [submit_mod.resolve_run(run, root)] if run else submit_mod.find_runs(root)
    rows = [submit_mod.run_status(r) for r in runs]
    if as_json:
        _echo_json(rows[0] if run else rows)
        return
    if not rows:
        click.echo(f"no runs under {root}")
        return
    for row in rows:
        extra = ", ".join(f"{k} {v}" for k, v in row.items()
                          if k in ("reason", "elapsed", "nodes", "exit_code", "train_state", "first_failure", "hint"))
        progress = row.get("progress")
        if progress:
            extra = (extra + ", " if extra else "") + " ".join(f"{k}={v}" for k, v in progress.items())
        click.echo(f"{row['run']}  job {row['job_id']}  {row['state']}" + (f"  ({extra})" if extra else ""))


@cli.command(context_settings=CONTEXT)
@click.argument("run")
@_RUNS_DIR_OPTION
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's log.")
def logs(run: str, runs_dir: str | None, follow: bool, rank: int | None) -> None:
    """Print a run's logs: the batch log and every rank's, each line prefixed with its source.

    \b
    Examples:
      hpc-train logs 4242
      hpc-train logs digits-lt-demo/4242 --rank 0 -f
    """
    from . import submit as submit_mod

    found = submit_mod.resolve_run(run, _runs_root(runs_dir))
    if rank is not None and found.record.get("world_size") and rank >= int(found.record["world_size"]):
        raise ConfigError(f"--rank {rank}: the run has ranks 0-{int(found.record['world_size']) - 1}")
    try:
        for line in submit_mod.follow_logs(found, rank, follow=follow, is_done=lambda: submit_mod.job_is_over(found)):
            click.echo(line)
    except KeyboardInterrupt:
        pass
    failure = submit_mod.first_failure(found)
    if failure:
        click.echo(f"first failure: {failure}", err=True)


@cli.command(context_settings=CONTEXT)
@click.argument("run")
@_RUNS_DIR_OPTION
def cancel(run: str, runs_dir: str | None) -> None:
    """Cancel a run's job.

    \b
    Example:
      hpc-train cancel digits-lt-demo/4242
    """
    from . import submit as submit_mod

    click.echo(submit_mod.cancel_run(submit_mod.resolve_run(run, _runs_root(runs_dir))))


# ------------------------------------------------------------------------------------------------
# Templates and example jobs
# ------------------------------------------------------------------------------------------------


def _export_tree(source: Path, dest: Path, force: bool) -> list[Path]:
    """Copy a shipped tree; refuse (before writing anything) to overwrite unless ``force``."""
    files = sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    clashes = [dest / p.relative_to(source) for p in files if (dest / p.relative_to(source)).exists()]
    if clashes and not force:
        raise ConfigError(f"{clashes[0]} already exists ({len(clashes)} file(s) would be overwritten); "
                          "choose an empty directory or pass --force")
    written = []
    for path in files:
        target = dest / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        written.append(target)
    return written


@cli.group(cls=_Group, context_settings=CONTEXT)
def templates() -> None:
    """List, show and export the sbatch templates (site directories first, then ours).

    \b
    Examples:
      hpc-train templates list
      hpc-train templates show default.sbatch.j2
      hpc-train templates export /etc/hpc-train/templates   # then edit, and list the dir in the site file
    """


def _site_dirs() -> tuple[Path, ...]:
    from .config import load_site

    return load_site().template_dirs


@templates.command("list", context_settings=CONTEXT)
def templates_list() -> None:
    """List the templates and partials, which file wins on the search path, and what it overrides."""
    from .render import list_templates, search_path

    for name, path, overridden in list_templates(_site_dirs()):
        click.echo(f"{name}  {path}" + (f"  (overrides {', '.join(map(str, overridden))})" if overridden else ""))
    click.echo("search path: " + ", ".join(str(d) for d in search_path(_site_dirs())), err=True)


@templates.command("show", context_settings=CONTEXT)
@click.argument("name", default="default.sbatch.j2")
def templates_show(name: str) -> None:
    """Print a template's source (partials too, e.g. partials/bootstrap.j2)."""
    from .render import template_source

    path, text = template_source(name, _site_dirs())
    click.echo(f"# {path}", err=True)
    click.echo(text, nl=False)


@templates.command("export", context_settings=CONTEXT)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
def templates_export(directory: Path, force: bool) -> None:
    """Copy our templates (and partials) to DIRECTORY, to start a site's own."""
    from .resources import templates_dir

    written = _export_tree(templates_dir(), directory, force)
    click.echo(f"exported {len(written)} file(s) to {directory}; add it to the site file's template_dirs")


@cli.group(cls=_Group, context_settings=CONTEXT)
def jobs() -> None:
    """List, show and export the example job files.

    \b
    Examples:
      hpc-train jobs list
      hpc-train jobs show cifar10_lt_ldam_drw
      hpc-train jobs export my-jobs/
    """


def _job_description(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


@jobs.command("list", context_settings=CONTEXT)
def jobs_list() -> None:
    """List the shipped example jobs."""
    from .resources import jobs_dir

    paths = sorted(jobs_dir().glob("*.yaml"))
    width = max((len(p.stem) for p in paths), default=0)
    for path in paths:
        click.echo(f"{path.stem.ljust(width)}  {_job_description(path)}".rstrip())


@jobs.command("show", context_settings=CONTEXT)
@click.argument("name")
def jobs_show(name: str) -> None:
    """Print an example job file."""
    from .resources import jobs_dir

    path = jobs_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(jobs_dir().glob("*.yaml")))
        raise ConfigError(f"no example job {name!r}; known: {known}")
    click.echo(path.read_text(encoding="utf-8"), nl=False)


@jobs.command("export", context_settings=CONTEXT)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
def jobs_export(directory: Path, force: bool) -> None:
    """Copy the example jobs to DIRECTORY."""
    from .resources import jobs_dir

    written = _export_tree(jobs_dir(), directory, force)
    click.echo(f"exported {len(written)} job file(s) to {directory}")


# ------------------------------------------------------------------------------------------------
# Provisioning
# ------------------------------------------------------------------------------------------------


@cli.command(context_settings=CONTEXT)
@click.option("--inventory", "-i", required=True, type=click.Path(path_type=Path), envvar="HPC_TRAIN_INVENTORY",
              show_envvar=True, help="Ansible inventory (file or directory).")
@click.option("--check", is_flag=True, help="Dry run: report what would change (ansible --check --diff).")
@click.option("--limit", "-l", help="Only these hosts/groups (ansible --limit).")
@click.option("--tags", help="Only these tags (ansible --tags).")
@click.option("--playbook", default="site.yml", show_default=True, help="Playbook under ansible/.")
@click.option("--extra-vars", "-e", "extra_vars", multiple=True, metavar="KEY=VALUE",
              help="Passed to ansible-playbook -e (repeatable), e.g. -e nvidia_driver_allow_change=true.")
def provision(inventory: Path, check: bool, limit: str | None, tags: str | None, playbook: str,
              extra_vars: tuple[str, ...]) -> None:
    """Install the NVIDIA driver, CUDA, NCCL and PyTorch on EL GPU nodes and make them Slurm GPU nodes.

    Runs ansible-playbook with the project's ansible.cfg (needs the 'ansible' extra).

    \b
    Examples:
      hpc-train provision -i inventories/prod --check
      hpc-train provision -i inventories/prod --limit gpu_nodes --tags driver
      hpc-train provision -i inventories/prod --limit gpu07 -e nvidia_driver_allow_change=true
    """
    from .provision import provision as run_provision

    extra_args = [arg for value in extra_vars for arg in ("-e", value)]
    code = run_provision(inventory, check=check, limit=limit, tags=tags, playbook=playbook, extra_args=extra_args)
    if code:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: click's own handling, but usage errors in two lines (what is wrong, where
    to look) instead of click's four."""
    try:
        code = cli.main(args=argv, prog_name="hpc-train", standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"Error: {exc.format_message()}", err=True)
        if exc.ctx is not None:
            click.echo(f"Try '{exc.ctx.command_path} --help'.", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
