"""hpc_train/cli/options.py: the ``--`` of ``submit [OPTIONS] [JOB] -- CMD ARGS...`` (WithCommand), the job
name of a bare command, and the flags' job keys."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from hpc_train.cli.options import FLAG_KEYS, WithCommand, command_name, job_options, user_command


@click.command(cls=WithCommand)
@job_options
def probe(**kwargs) -> None:
    """Echo what the command parsed: its options and the argv after ``--``."""
    click.echo(repr((kwargs["job"], kwargs["nodes"], kwargs["sets"], user_command())))


def test_everything_after_the_first_dash_dash_is_the_argv_as_typed():
    result = CliRunner().invoke(probe, ["job.yaml", "--nodes", "2", "--", "python", "-m", "x", "--nodes", "9", "--"])
    assert result.exit_code == 0, result.output
    assert result.output == repr(("job.yaml", 2, (), ("python", "-m", "x", "--nodes", "9", "--"))) + "\n"


def test_without_dash_dash_there_is_no_user_command():
    result = CliRunner().invoke(probe, ["--set", "train.epochs=3"])
    assert result.output == repr((None, None, ("train.epochs=3",), None)) + "\n"


def test_nothing_after_dash_dash_is_a_usage_error():
    result = CliRunner().invoke(probe, ["job.yaml", "--"])
    assert result.exit_code == 2 and "nothing after '--'" in result.output


def test_the_usage_line_shows_the_command_part():
    result = CliRunner().invoke(probe, ["--help"])
    assert "[-- CMD [ARGS]...]" in result.output.splitlines()[0]


@pytest.mark.parametrize(("argv", "name"), [
    (("python", "-m", "mylab.train", "--lr", "0.1"), "mylab.train"),
    (("python", "scripts/train.py", "--epochs", "3"), "train"),
    (("./run.sh",), "run.sh"),  # the program itself: its name as it is
    (("torchrun", "--nproc-per-node", "2", "fit.py"), "fit"),
    (("/opt/bin/my tool",), "my-tool"),
    (("...",), "command"),
])
def test_a_bare_command_is_named_by_its_module_or_script(argv, name):
    assert command_name(argv) == name


def test_every_flag_sets_a_job_key_the_job_options_take():
    names = {param.name for param in probe.params}
    assert set(FLAG_KEYS) <= names | {"pack"}  # --pack comes with the sweep options
