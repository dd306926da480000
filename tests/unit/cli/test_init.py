"""hpc_train/cli/__init__.py: the console script (``hpc_train.cli:main``) and the wiring: importing the
package registers every command module's commands on the group, and ``from hpc_train.cli import cli`` is it."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

import click
import pytest

import hpc_train.cli
from hpc_train.cli import cli, main
from hpc_train.cli import group as group_module

COMMAND_MODULES = ("asset_commands", "job_commands", "run_commands")


def _reachable(command: click.Command) -> list[click.Command]:
    found = [command]
    for sub in getattr(command, "commands", {}).values():
        found += _reachable(sub)
    return found


def test_the_package_exports_the_groups_own_cli():
    assert hpc_train.cli.cli is group_module.cli


@pytest.mark.parametrize("module_name", COMMAND_MODULES)
def test_every_command_a_module_defines_is_on_the_group(module_name):
    module = import_module(f"hpc_train.cli.{module_name}")
    defined = [value for value in vars(module).values()
               if isinstance(value, click.Command) and value.callback is not None
               and value.callback.__module__ == module.__name__]
    assert defined, f"{module_name} defines no command"
    reachable = [id(c) for c in _reachable(cli)]
    assert [c.name for c in defined if id(c) not in reachable] == []


def test_every_command_on_the_group_comes_from_a_command_module():
    modules = {c.callback.__module__ for c in _reachable(cli)[1:]}
    assert modules == {f"hpc_train.cli.{name}" for name in COMMAND_MODULES}


def test_importing_the_package_alone_registers_every_command_module():
    # In a fresh interpreter: here the tests above have imported every command module themselves.
    code = ("import hpc_train.cli as c\n"
            "def walk(cmd): return [cmd] + [x for sub in getattr(cmd, 'commands', {}).values() for x in walk(sub)]\n"
            "print(' '.join(sorted({x.callback.__module__ for x in walk(c.cli)[1:]})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [f"hpc_train.cli.{name}" for name in COMMAND_MODULES]


def test_main_exits_with_the_commands_code(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and "hpc-train" in capsys.readouterr().out


def test_main_says_a_usage_error_in_two_lines(capsys):
    with pytest.raises(SystemExit) as done:
        main(["no-such-command"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["Error: No such command 'no-such-command'.",
                                                    "Try 'hpc-train --help'."]


def test_main_refuses_bad_configuration_with_exit_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        main(["render", "--set", "train.epochs=0", "--output", str(tmp_path / "x.sbatch")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("Error: train.epochs") and len(err.splitlines()) <= 2, err
    assert "Traceback" not in err and not (tmp_path / "x.sbatch").exists()
