"""The ``hpc-train`` group: the click group every command module adds its commands to, and the one place a
command's :class:`~hpc_train.errors.HpcTrainError` becomes a short message with its exit code
(``Group.invoke``). Its own module so that the command modules import it without importing the package. A command
module is imported when one of its commands is asked for (:data:`COMMAND_MODULES`): ``hpc-train render`` pays for
the job commands only, not for the run and asset commands' imports."""

from __future__ import annotations

import gc
from importlib import import_module
from typing import Any, Mapping

import click

from .. import __version__
from ..errors import HpcTrainError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _CliError(click.ClickException):
    def __init__(self, exc: HpcTrainError) -> None:
        super().__init__(str(exc))
        self.exit_code = exc.exit_code


COMMAND_MODULES = {
    "render": "job_commands", "submit": "job_commands", "simulate": "job_commands", "train": "job_commands",
    "status": "run_commands", "logs": "run_commands", "cancel": "run_commands", "report": "run_commands",
    "env": "run_commands",
    "templates": "asset_commands", "jobs": "asset_commands", "provision": "asset_commands",
}
"""Each command of ``hpc-train`` and the module (in this package) that defines it and registers it on :data:`cli`
when imported (tests/unit/cli/test_init.py checks the two agree)."""


class Group(click.Group):
    """A click group whose commands' HpcTrainErrors become short messages with their exit codes, and whose commands
    may live in modules imported when first asked for (``lazy_modules``: command name -> module of this package)."""

    lazy_modules: Mapping[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_modules})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_modules:
            import_module(f"{__package__}.{self.lazy_modules[cmd_name]}")  # registers its commands on this group
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        resolved = super().resolve_command(ctx, args)
        if not gc.isenabled():
            # Start-up is over (main() paused the cyclic collector for it): what it made is frozen out of every later
            # collection, and the command runs with the collector on, however long it runs (submit --wait, train).
            gc.freeze()
            gc.enable()
        return resolved

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


cli.lazy_modules = COMMAND_MODULES
