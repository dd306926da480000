"""hpc_train/cli/group.py: the group every command module adds to, and the one place a command's
HpcTrainError becomes a short message with its exit code."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from hpc_train.cli.group import CONTEXT, Group, cli
from hpc_train.errors import ConfigError, HpcTrainError, JobFailedError


def _group_raising(error: Exception) -> click.Group:
    @click.group(cls=Group, context_settings=CONTEXT)
    def top() -> None:
        pass

    @top.command()
    def fail() -> None:
        raise error

    return top


@pytest.mark.parametrize(("error", "code"), [(ConfigError("train.epochs: must be at least 1"), 2),
                                             (JobFailedError("the run failed: see its log"), 1)])
def test_an_hpc_train_error_is_one_line_and_its_exit_code(error, code):
    result = CliRunner().invoke(_group_raising(error), ["fail"])
    assert result.exit_code == code
    assert result.output == f"Error: {error}\n"
    assert result.exc_info[0] is SystemExit  # no traceback: click printed it and exited


def test_any_other_exception_is_not_hidden():
    result = CliRunner().invoke(_group_raising(RuntimeError("a bug")), ["fail"])
    assert isinstance(result.exception, RuntimeError)


def test_the_group_is_an_error_mapping_group_with_the_shared_context():
    assert isinstance(cli, Group) and issubclass(Group, click.Group)
    assert cli.context_settings["help_option_names"] == ["-h", "--help"]
    assert not issubclass(ConfigError, click.ClickException) and issubclass(ConfigError, HpcTrainError)
