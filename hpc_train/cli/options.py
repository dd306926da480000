"""Options several commands share, and the few helpers behind them (the job they name, the runs root)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from ..errors import ConfigError


def _declared_flags():
    """(dotted job key, field, flag) of every option declared on a job field (hpc_train/config/slurm_options.py)."""
    from ..config import JobSpec, SlurmConfig
    from ..config.slurm_options import cli_flags

    return [*cli_flags(SlurmConfig, "slurm"), *cli_flags(JobSpec)]


def _parameter(flag) -> str:
    return flag.name.lstrip("-").replace("-", "_")


DECLARED_FLAGS = _declared_flags()
"""Read once: every command's options and FLAG_KEYS come from this one list."""
FLAG_KEYS = {_parameter(flag): key for key, _field, flag in DECLARED_FLAGS}
"""Explicit flags and the job keys they set (the top layer of the configuration), from the fields that declare them."""


def _click_option(key: str, field, flag) -> Callable[..., Any]:
    """A click option from a field's declared flag: its type from the field's (a Literal's choices, an int's bounds)."""
    import typing

    from ..config import JobSpec, field_type

    kind = field_type(key, JobSpec, flag.name)
    kind = next((arg for arg in typing.get_args(kind) if arg is not type(None)), kind) \
        if type(None) in typing.get_args(kind) else kind
    choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
    bounds = field.metadata.get("bounds")
    if choices:
        click_type: Any = click.Choice(list(choices))
    elif kind is int:
        # The lower bound only: a value above the upper one gets the job's own message (bounds.check), with its hint.
        click_type = click.IntRange(min=None if bounds is None else bounds.low)
    else:
        click_type = None
    names = [flag.name, *([flag.short] if flag.short else [])]
    return click.option(*names, type=click_type, envvar=flag.envvar, show_envvar=flag.envvar is not None,
                        metavar=flag.metavar, help=flag.help)


def _flag_options(group: str) -> dict[str, Callable[..., Any]]:
    return {_parameter(flag): _click_option(key, field, flag) for key, field, flag in DECLARED_FLAGS
            if flag.group == group}


RUNS_DIR_HELP = "Where run directories go (default: the job's runs_dir, ./runs)."


def _apply(func: Callable[..., Any], options: list[Callable[..., Any]]) -> Callable[..., Any]:
    for option in reversed(options):
        func = option(func)
    return func


def _job_options() -> dict[str, Callable[..., Any]]:
    """Every option that names or shapes a job, by name (each command takes those that mean something to it)."""
    return {
        "job": click.argument("job", required=False, metavar="[JOB]"),
        **_flag_options("job"),
        "set": click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                            help="Override any job key, value read by its field's type (e.g. --set train.epochs=10, "
                                 "--set train.amp=off). Repeatable."),
        "epochs": click.option("--epochs", type=click.IntRange(min=1), metavar="N",
                               help="Train N epochs, every epoch-indexed key (warm-up, milestones, DRW, cRT) rescaled "
                                    "in proportion (every result at most 2^31 - 1); prints what it changed."),
    }


def job_options(func: Callable[..., Any]) -> Callable[..., Any]:
    return _apply(func, list(_job_options().values()))


def simulate_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What changes the rank mapping (``simulate``): the job, the allocation's shape, and --set for the rest
    (slurm.master_port_base, ...); time, partition, account, names and epochs do not."""
    options = _job_options()
    return _apply(func, [options[k] for k in ("job", "nodes", "gpus", "tasks_per_node", "set")])


def sweep_options(func: Callable[..., Any]) -> Callable[..., Any]:
    return _apply(func, [
        click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
                     help="One run (an array task on Slurm) per value; several --sweep: their grid (at most 10,000 "
                          "points; more than the cluster's MaxArraySize go as several arrays). train.* keys only."),
        click.option("--sweep-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="YAML sweep: {key: [values]} (grid) or {points: [{key: value}, ...]}."),
        click.option("--max-parallel", type=click.IntRange(min=1, max=10_000),
                     help="Slurm: the array throttle, at most N tasks at once (%N, on each array). Local runs ignore it: they go "
                          "one at a time, or K at a time with --pack K."),
        *_flag_options("sweep").values(),
    ])


class WithCommand(click.Command):
    """A command that takes the user's own program after ``--`` (``submit [OPTIONS] [JOB] -- CMD ARGS...``):
    everything after the first ``--`` is the argv, exactly as typed, never read as options or YAML."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta["user_command"] = tuple(args[at + 1:])
            if not ctx.meta["user_command"]:
                raise click.UsageError("nothing after '--': give the command every rank runs, e.g. -- python train.py",
                                       ctx)
            args = args[:at]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- CMD [ARGS]...]"]


def user_command() -> tuple[str, ...] | None:
    """The argv after ``--`` of the running command (None when there was none)."""
    return click.get_current_context().meta.get("user_command")


def command_name(argv: tuple[str, ...]) -> str:
    """A job name for a command submitted without a job file or --name: the module of ``python -m X``, the
    script's stem (``train`` for ``python train.py``), else the program's name."""
    import re

    word = Path(argv[0]).name
    if "-m" in argv[1:-1]:
        word = argv[argv.index("-m", 1) + 1]
    else:
        scripts = [w for w in argv[1:] if w.endswith((".py", ".sh")) and not w.startswith("-")]
        word = Path(scripts[0]).stem if scripts else word
    return re.sub(r"[^A-Za-z0-9._-]+", "-", word).strip("-.")[:64] or "command"


runs_dir_option = click.option("--runs-dir", envvar="HPC_TRAIN_RUNS_DIR", show_envvar=True,
                               help="Where run directories are (default: the site file's runs_dir, else ./runs; "
                                    "runs submitted from here are found wherever they are).")


def resolve(kwargs: dict[str, Any], job: str | Path | None = None):
    """The job a command works on (site file, job file, --set, flags and any sweep): config.resolve."""
    from ..config import resolve as resolve_config

    flags = {key: kwargs.get(opt) for opt, key in FLAG_KEYS.items()}
    flags["command"] = user_command()
    if flags["command"] and flags["name"] is None and job is None and kwargs.get("job") is None:
        flags["name"] = command_name(flags["command"])
    resolved = resolve_config(job if job is not None else kwargs.get("job"), sets=kwargs.get("sets", ()),
                              flags=flags, sweeps=kwargs.get("sweeps", ()), sweep_file=kwargs.get("sweep_file"),
                              epochs=kwargs.get("epochs"))
    if resolved.epochs_change:
        click.echo(resolved.epochs_change, err=True)
    return resolved


def runs_root(runs_dir: str | None) -> Path:
    """The runs root of the layered configuration: --runs-dir (or $HPC_TRAIN_RUNS_DIR), else the site file's
    runs_dir, else the default job's (./runs)."""
    from ..config import JobSpec, load_site
    from ..runs import rundir

    if runs_dir is None:
        site_value = load_site().defaults.get("runs_dir")
        runs_dir = getattr(site_value, "text", None) or JobSpec().runs_dir
    return rundir.runs_root(runs_dir).resolve()  # ~ expanded there


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def write_output(path: Path, text: str) -> None:
    """Write a file the user named (``-o``), whole or not at all; an impossible path is exit 2 with its reason. A
    device or FIFO the user named (``-o /dev/stdout``, ``-o /dev/full``) is written into, never replaced by a
    regular file: ``/dev/full`` is ENOSPC, as it should be."""
    from ..runs import rundir

    try:
        if path.exists() and not path.is_file():
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
            return
        rundir.write_text_atomic(path, text)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
