"""The ``hpc-train`` group: the click group every command module adds its commands to, and the one place a
command's :class:`~hpc_train.errors.HpcTrainError` becomes a short message with its exit code
(``Group.invoke``). Its own module so that the command modules import it without importing the package that
imports them (:mod:`hpc_train.cli` imports the command modules, which register their commands here)."""

from __future__ import annotations

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
