"""The ``hpc-train`` command line: parsing and printing only.

Work happens in typed functions (config, render, slurm, local, runs, rank, provision); their one
error family, :class:`~hpc_train.errors.HpcTrainError`, becomes a click error here, in one place
(``_Group.invoke``): a one- or two-line message, exit 2 for usage/config errors and 1 for failed jobs, no
traceback. torch and submitit are imported inside the commands that need them, never at import time.

Commands live by theme: :mod:`.job_commands` (render, submit, simulate, train), :mod:`.run_commands`
(status, logs, cancel), :mod:`.asset_commands` (templates, jobs, provision); :mod:`.options` holds the
options they share.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import __version__
from ..errors import HpcTrainError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _CliError(click.ClickException):
    def __init__(self, exc: HpcTrainError) -> None:
        super().__init__(str(exc))
        self.exit_code = exc.exit_code


class Group(click.Group):
    """A click group whose commands' HpcTrainErrors become short messages with their exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HpcTrainError as exc:
            raise _CliError(exc) from None


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="hpc-train")
def cli() -> None:
    """Train PyTorch long-tail classifiers with DDP on Slurm GPU clusters.

    \b
    hpc-train render --nodes 4 --gpus 8           print the sbatch script (no Slurm needed)
    hpc-train submit --nodes 4 --gpus 8 JOB.yaml  submit it (through submitit)
    hpc-train submit                              the built-in demo job, locally if no Slurm
    hpc-train simulate --nodes 2 --gpus 4 --nodelist 'gpu[01-02]'

    JOB is a YAML job file or the name of a shipped example job (see `hpc-train jobs list`);
    without JOB the built-in default job (jobs/digits_lt_demo.yaml) is used. Exit codes: 0 ok,
    1 the job failed, 2 bad usage or configuration (one or two lines, nothing written, nothing queued).
    """


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


from . import asset_commands, job_commands, run_commands  # noqa: E402,F401  (they register their commands)
