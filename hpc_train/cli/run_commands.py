"""status, logs, cancel: the commands that work on runs (wherever their job's runs_dir put them)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import ConfigError
from .group import CONTEXT, cli
from .options import echo_json, runs_dir_option, runs_root


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False)
@runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (accuracy as fractions).")
def status(run: str | None, runs_dir: str | None, as_json: bool) -> None:
    """Show the state of a run, of a sweep, or of every run here (under the runs directory, and the runs
    submitted from this directory wherever their job's runs_dir put them).

    RUN is a run name (name/id), a job id, a run directory (`.` inside one, `../ID`), or a job name
    (its latest run). The state (queued, running, completed, failed, cancelled, preempted, requeued)
    is what the run directory recorded, checked against squeue and sacct; a failed run says why, and names its first failing
    rank and host. A RUN that names nothing ('', '/', wildcards only) or fits runs of several jobs is refused
    with the candidates (exit 2). A sweep (a job name whose latest submission was one, NAME/ID_* as submit prints it, or the
    array id) is one line with its points per state; NAME/ID_K is one point. Accuracy is shown in percent.
    Without Slurm here, Slurm runs that have not ended are `unknown`.

    \b
    Examples:
      hpc-train status
      hpc-train status digits-lt-demo/4242 --json
      hpc-train status lt-sweep             # the sweep: one line, points per state
      hpc-train status lt-sweep/60_3        # one point of it
    """
    from ..front.status import run_statuses
    from ..runs import sweeps
    from ..runs.index import find_runs
    from ..runs.status_lines import run_line, sweep_line

    root = runs_root(runs_dir)
    if run is not None:
        chosen, is_sweep = sweeps.find(run, root)
        rows = run_statuses(chosen)
        data: object = sweeps.sweep_status(chosen[0], rows).to_dict() if is_sweep else rows[0]
        lines = [sweep_line(data) if is_sweep else run_line(rows[0])]  # type: ignore[arg-type]
    else:
        rows = run_statuses(find_runs(root), listing=True)  # a squeue that fails hides no run
        data, lines = rows, [run_line(row) for row in rows] or [f"no runs under {root}, and none submitted from here"]
    if as_json:
        echo_json(data)
        return
    for line in lines:
        click.echo(line)


@cli.command(context_settings=CONTEXT)
@click.argument("run")
@runs_dir_option
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's log.")
def logs(run: str, runs_dir: str | None, follow: bool, rank: int | None) -> None:
    """Print a run's logs: the batch log and every rank's, each line prefixed with its source.

    \b
    Examples:
      hpc-train logs 4242
      hpc-train logs digits-lt-demo/4242 --rank 0 -f
    """
    from ..front.status import is_over
    from ..runs.index import resolve_run
    from ..runs.status import first_failure, follow_logs

    found = resolve_run(run, runs_root(runs_dir))
    world = int(found.record.get("world_size") or 0)
    if rank is not None and world and rank >= world:
        raise ConfigError(f"--rank {rank}: the run has ranks 0-{world - 1}")
    try:
        for line in follow_logs(found, rank, follow=follow, is_done=lambda: is_over(found)):
            click.echo(line)
    except KeyboardInterrupt:
        pass
    failure = first_failure(found)
    if failure:
        click.echo(f"first failure: {failure}", err=True)


@cli.command(context_settings=CONTEXT)
@click.argument("run")
@runs_dir_option
def cancel(run: str, runs_dir: str | None) -> None:
    """Cancel a run (scancel on Slurm; a local run's ranks are ended at once; a `train` run alone gets SIGTERM, it
    checkpoints, SIGKILL after 30 s), or a whole sweep (every point, and each of its job arrays). RUN must name it exactly (run name, job id, run directory, or a job name: its latest
    run); a RUN that names nothing ('', '/', '_*') or fits runs of several jobs cancels nothing (exit 2).

    \b
    Examples:
      hpc-train cancel digits-lt-demo/4242
      hpc-train cancel lt-sweep             # every point of the sweep
    """
    from ..front.status import cancel_run, cancel_sweep
    from ..runs import sweeps

    chosen, is_sweep = sweeps.find(run, runs_root(runs_dir))
    click.echo(cancel_sweep(chosen) if is_sweep else cancel_run(chosen[0]))


@cli.command(context_settings=CONTEXT)
@click.argument("runs", nargs=-1, required=True, metavar="NAME|RUN...")
@runs_dir_option
@click.option("--seed-key", "seed_keys", multiple=True, metavar="KEY", help="Keys that vary over seeds, not "
              "configurations (default: train.seed). Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (fractions, not percent).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also draw per-class accuracy against training images, one line per configuration (PNG).")
def report(runs: tuple[str, ...], runs_dir: str | None, seed_keys: tuple[str, ...], as_json: bool,
           plot: Path | None) -> None:
    """One table over the runs of a sweep (or any runs): a row per configuration — the keys that differ
    between the runs, except the seed — with the mean and sample standard deviation (ddof 1) over seeds of
    top-1, balanced, many, medium and few accuracy and the calibration error (ECE) at the last epoch, the best
    on a held-out split (only with one) and the best on test (best_on_test), and how many runs finished, are
    running or failed. Works while runs are still going (it reads metrics.jsonl).

    NAME|RUN: a job name (all its runs), an array job id or name/<array id> (that sweep), a run name, a run
    directory or a job's directory of runs.

    \b
    Examples:
      hpc-train report digits-lt-demo
      hpc-train report digits-lt-demo/4242 --json
      hpc-train report 4242 --seed-key train.seed --seed-key train.data.seed --plot per-class.png
    """
    from ..front.status import run_states
    from ..runs import report as report_mod

    chosen = report_mod.select(runs, runs_root(runs_dir))
    results = [report_mod.load(r, state) for r, state in zip(chosen, run_states(chosen))]
    data = report_mod.summarise(results, seed_keys or ("train.seed",))
    if plot is not None:
        report_mod.plot(results, data, plot)
    if as_json:
        echo_json(data)
    else:
        click.echo(report_mod.format_report(data), nl=False)
    if plot is not None:
        click.echo(f"wrote {plot}", err=True)


@cli.command("env", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the mapping as JSON.")
def env_command(as_json: bool) -> None:
    """Print what this process is in a job: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,
    MASTER_ADDR, MASTER_PORT as hpc_train.dist maps them from the launcher's variables (torchrun's, the local
    launcher's, Slurm's), where they came from, the run directory and the restart count. Run it inside a job;
    a launcher environment that does not add up is an error saying what to change (exit 2).

    \b
    Examples:
      hpc-train submit --nodes 2 --gpus 4 -- hpc-train env   # each rank's line is in its log
      srun --ntasks-per-node=4 hpc-train env
    """
    import os

    from ..rank.dist import DistEnv, launch_info

    dist = DistEnv.from_environ()
    source = os.environ.get("HPC_TRAIN_MAPPED_FROM", dist.source)  # mapped by hpc-train's rank wrapper
    info = {"rank": dist.rank, "local_rank": dist.local_rank, "world_size": dist.world_size,
            "local_world_size": dist.local_world_size, "node_rank": dist.node_rank, "master_addr": dist.master_addr,
            "master_port": dist.master_port, "source": source, "host": dist.hostname, "job_id": dist.job_id,
            **launch_info()}
    if as_json:
        echo_json(info)
        return
    click.echo(f"RANK={dist.rank} LOCAL_RANK={dist.local_rank} WORLD_SIZE={dist.world_size} "
               f"LOCAL_WORLD_SIZE={dist.local_world_size} NODE_RANK={dist.node_rank} MASTER_ADDR={dist.master_addr} "
               f"MASTER_PORT={dist.master_port} host={dist.hostname} source={source} "
               f"restart={info['restart']} run_dir={info['run_dir'] or '-'}")
