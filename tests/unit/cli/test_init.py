"""hpc_train/cli/__init__.py: the console script (``hpc_train.cli:main``) and the wiring: the group lists every
command module's commands, imports a module when one of its commands is asked for (group.COMMAND_MODULES), and
``from hpc_train.cli import cli`` is it."""

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
    """The command and every command under it, as the group hands them out (importing their modules)."""
    found = [command]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            found += _reachable(command.get_command(ctx, name))
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


def test_the_lazy_map_names_every_command_where_it_is_defined():
    defined = {c.name: c.callback.__module__ for c in _reachable(cli)[1:] if c.name in cli.commands}
    assert defined == {name: f"hpc_train.cli.{module}" for name, module in group_module.COMMAND_MODULES.items()}


def test_a_command_imports_only_its_own_module():
    # In a fresh interpreter (here the tests above have imported every command module): `render` needs
    # job_commands alone; `--help` lists every command, which imports them all.
    code = ("import sys, hpc_train.cli as c\n"
            "mods = lambda: [m for m in sorted(sys.modules) if m.endswith('_commands')]\n"
            "print(mods())\n"
            "c.cli.get_command(None, 'render'); print(mods())\n"
            "from click.testing import CliRunner\n"
            "out = CliRunner().invoke(c.cli, ['--help']).output; print(mods())\n"
            "print(' '.join(sorted(name for name in c.group.COMMAND_MODULES if f'  {name} ' in out)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[:3] == ["[]", "['hpc_train.cli.job_commands']",
                         str([f"hpc_train.cli.{name}" for name in COMMAND_MODULES])]
    assert lines[3].split() == sorted(group_module.COMMAND_MODULES)


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


def test_the_collector_waits_out_start_up_and_is_on_while_a_command_runs():
    # main() pauses Python's cyclic collector while the CLI imports itself and freezes what that made; a command
    # (submit --wait, train: hours) must run with it on, or cycles it makes would never be freed.
    code = ("import gc, sys\nfrom hpc_train.cli import cli, main\n"
            "@cli.command('gc-probe')\ndef gc_probe():\n    print(gc.isenabled(), gc.get_freeze_count() > 0)\n"
            "sys.argv = ['hpc-train', 'gc-probe']\nmain()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_a_cli_run_inside_another_program_leaves_its_collector_alone():
    # Tests and tools invoke the group itself: nothing is frozen there (it would keep that program's garbage forever).
    import gc

    frozen = gc.get_freeze_count()
    from click.testing import CliRunner

    assert CliRunner().invoke(cli, ["jobs", "list"]).exit_code == 0
    assert gc.isenabled() and gc.get_freeze_count() <= frozen  # frozen objects may die, none are added
