"""The ``hpc-train`` command line: parsing and printing only.

Work happens in typed functions (config, render, slurm, local, runs, rank, provision); their one
error family, :class:`~hpc_train.errors.HpcTrainError`, becomes a click error in one place
(``Group.invoke``, :mod:`.group`): a one- or two-line message, exit 2 for usage/config errors and 1 for
failed jobs, no traceback. torch and submitit are imported inside the commands that need them, never at
import time.

The group is :mod:`.group`'s; the commands, by theme, add themselves to it: :mod:`.job_commands` (render,
submit, simulate, train), :mod:`.run_commands` (status, logs, cancel, report, env), :mod:`.asset_commands`
(templates, jobs, provision), each module imported when one of its commands is asked for
(:data:`.group.COMMAND_MODULES`: ``hpc-train render`` imports no run or asset command); :mod:`.options` holds the
options they share. :func:`main` is the console script.
"""

from __future__ import annotations

import gc
import sys

import click

from .group import CONTEXT, Group, cli

__all__ = ["CONTEXT", "Group", "cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console entry point: click's own handling, but usage errors in two lines (what is wrong, where
    to look) instead of click's four."""
    # Start-up is imports: objects that live until exit, which Python's cyclic collector would walk every few hundred
    # allocations while they load, and once more at exit, freeing nothing. It waits until the command is chosen
    # (Group.resolve_command freezes what start-up made and turns it back on), and what is left at exit is frozen
    # too: a fifth of `hpc-train render` on a login node (BENCHMARKS.md, CLI start-up).
    gc.disable()
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
    finally:
        gc.freeze()  # nothing the command made is freed by the last collection at exit: it ends with the process
    sys.exit(code if isinstance(code, int) else 0)
