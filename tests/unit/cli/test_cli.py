"""The command line: help texts, bad input (exit 2, short message, nothing written), simulate, templates, jobs."""

import json

import click
import pytest
from click.testing import CliRunner

from hpc_train.cli import cli
from tests.cli_helpers import assert_refused, cli as run

def _command_tree(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], bool]]:
    """Every command under ``group`` as (its words, whether it is a sub-command of a group other than the top)."""
    found = [(path, False)] if not path else []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # as the group hands them out: its command modules load on demand
        command = group.get_command(ctx, name)
        found.append(((*path, name), bool(path)))
        if isinstance(command, click.Group):
            found += [(words, True) for words, _ in _command_tree(command, (*path, name))]
    return found


COMMANDS = _command_tree(cli)


def test_the_walk_finds_every_command():
    words = {" ".join(c) for c, _ in COMMANDS}
    assert {"", "render", "submit", "status", "env", "report", "templates show", "jobs export"} <= words


@pytest.mark.parametrize("command, in_group", COMMANDS, ids=lambda c: " ".join(c) if isinstance(c, tuple) else "")
def test_help_has_an_example(command, in_group):
    result = CliRunner().invoke(cli, [*command, "--help"], catch_exceptions=False)
    assert result.exit_code == 0
    assert "Usage: " in result.output
    if in_group:
        return  # leaf commands of a group: the group's help carries the examples
    assert "hpc-train " in result.output.split("Options:")[0], "help text should show an example command line"


@pytest.mark.parametrize(
    "args,message",
    [
        (["render", "--nodes", "0"], "0 is not in the range x>=1"),
        (["render", "--nodes", "two"], "'two' is not a valid integer"),
        (["render", "--gpus", "-1"], "-1 is not in the range x>=0"),
        (["render", "--time", "25:99:aa"], "is not a Slurm time"),
        (["render", "--set", "slurm.nodez=2"], "unknown key 'slurm.nodez'; valid keys under 'slurm': nodes"),
        (["render", "--set", "nonsense"], "expected KEY=VALUE"),
        (["render", "missing-job.yaml"], "job file not found: missing-job.yaml"),
        (["render", "bad-syntax.yaml"], "bad-syntax.yaml:3:1: YAML syntax error"),
        (["render", "unknown-key.yaml"], "unknown key 'slurm.gpus'; valid keys under 'slurm'"),
        (["render", "--set", "slurm.template=nope.sbatch.j2"], "template 'nope.sbatch.j2' not found; search path:"),
        (["render", "--set", "slurm.template=broken.sbatch.j2"], "broken.sbatch.j2:2: template syntax error"),
        (["render", "--launcher", "mpirun"], "'mpirun' is not one of 'srun', 'torchrun'"),
        (["render", "--set", "slurm.launcher=mpirun"], "slurm.launcher: must be one of 'srun', 'torchrun'"),
        (["submit", "--cluster", "local", "--nodes", "2"], "2 nodes requested but --cluster local"),
        (["render", "--gpus", "4", "--tasks-per-node", "3"], "3 ranks per node but 4 GPUs per node"),
        (["jobs", "show", "no-such-job"], "no example job 'no-such-job'; known: "),
    ],
)
def test_bad_input(tmp_path, args, message):
    (tmp_path / "bad-syntax.yaml").write_text("name: x\nslurm: {nodes: 2\n")
    (tmp_path / "unknown-key.yaml").write_text("slurm:\n  gpus: 4\n")
    templates = tmp_path / "site-templates"
    templates.mkdir()
    (templates / "broken.sbatch.j2").write_text("#!/bin/bash\n{% for x in %}\n")
    (tmp_path / "site.yaml").write_text(f"template_dirs: [{templates}]\n")
    env = {"HPC_TRAIN_SITE": str(tmp_path / "site.yaml"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = run(*args, "-o", str(tmp_path / "out.sh"), cwd=tmp_path, env=env) if args[0] == "render" \
        else run(*args, cwd=tmp_path, env=env)
    assert_refused(result, message)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "bad input must not write anything"


def test_render_to_file_and_stdout_agree(tmp_path):
    out = tmp_path / "job.sbatch"
    result = run("render", "--nodes", "4", "--gpus", "8", "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0 and "sbatch " in result.stderr
    printed = run("render", "--nodes", "4", "--gpus", "8", cwd=tmp_path).stdout
    assert out.read_text() == printed
    assert "#SBATCH --nodes=4" in printed and "#SBATCH --ntasks-per-node=8" in printed
    assert "#SBATCH --gpus-per-node=8" in printed


def test_env_vars_set_options(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HPC_TRAIN_NODES": "4", "HPC_TRAIN_PARTITION": "big"}
    printed = run("render", cwd=tmp_path, env=env).stdout
    assert "#SBATCH --nodes=4" in printed and "#SBATCH --partition=big" in printed


def test_simulate_table_and_json():
    runner = CliRunner()
    result = runner.invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--nodelist", "gpu[01-02]", "--json",
                                 "--job-id", "4242"], catch_exceptions=False)
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["host"]) for r in rows] == [
        (n * 4 + l, l, n, f"gpu0{n + 1}") for n in range(2) for l in range(4)]
    assert {(r["world_size"], r["master_addr"], r["master_port"]) for r in rows} == {(8, "gpu01", 24242)}
    table = runner.invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--nodelist", "gpu[01-02]"]).output
    lines = table.splitlines()
    assert lines[0].split() == ["RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "HOST", "MASTER_ADDR", "MASTER_PORT"]
    assert lines[6].split()[:5] == ["5", "1", "1", "8", "gpu02"]


def test_simulate_wrong_nodelist_size():
    result = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--nodelist", "gpu[01-03]"])
    assert result.exit_code == 2 and "has 3 hosts but the job asks for 2 nodes" in result.output


def test_templates_and_jobs_commands(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(cli, ["templates", "list"], catch_exceptions=False).output
    assert "default.sbatch.j2" in listed
    shown = runner.invoke(cli, ["templates", "show", "partials/bootstrap.j2"], catch_exceptions=False).output
    assert "module purge" in shown
    result = runner.invoke(cli, ["templates", "export", str(tmp_path / "t")], catch_exceptions=False)
    assert result.exit_code == 0
    assert (tmp_path / "t" / "default.sbatch.j2").is_file() and (tmp_path / "t" / "partials" / "rendezvous.j2").is_file()
    # A second export refuses, before writing anything.
    (tmp_path / "t" / "default.sbatch.j2").write_text("mine")
    again = runner.invoke(cli, ["templates", "export", str(tmp_path / "t")])
    assert again.exit_code == 2 and "already exists" in again.output
    assert (tmp_path / "t" / "default.sbatch.j2").read_text() == "mine"

    jobs = runner.invoke(cli, ["jobs", "list"], catch_exceptions=False).output
    assert "digits_lt_demo" in jobs
    assert "name: digits-lt-demo" in runner.invoke(cli, ["jobs", "show", "digits_lt_demo"]).output
    assert runner.invoke(cli, ["jobs", "export", str(tmp_path / "j")]).exit_code == 0
    assert (tmp_path / "j" / "digits_lt_demo.yaml").is_file()


def test_job_by_example_name():
    result = CliRunner().invoke(cli, ["render", "digits_lt_demo"], catch_exceptions=False)
    assert result.exit_code == 0 and "#SBATCH --job-name=digits-lt-demo" in result.output


def test_submit_dry_run_local_says_what_it_would_do(tmp_path):
    result = run("submit", "--cluster", "local", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0 and "would run 2 local rank(s)" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_provision_passes_options_to_ansible_playbook(tmp_path):
    """The real provision() path, with a stand-in ansible-playbook on PATH that records its argv/env."""
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    record = tmp_path / "argv"
    (stub_dir / "ansible-playbook").write_text(
        f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {record}\necho \"$ANSIBLE_CONFIG\" >> {record}\nexit 3\n")
    (stub_dir / "ansible-playbook").chmod(0o755)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    env = {"PATH": f"{stub_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = run("provision", "-i", str(inventory), "--check", "--limit", "gpu07", "--tags", "driver",
                 "-e", "nvidia_driver_allow_change=true", "-e", "a=b c", cwd=tmp_path, env=env)
    assert result.returncode == 1  # ansible-playbook failed (3): the job failed, exit 1
    lines = record.read_text().splitlines()
    assert lines[:2] == ["-i", str(inventory)] and lines[2].endswith("ansible/site.yml")
    assert lines[3:-1] == ["--check", "--diff", "--limit", "gpu07", "--tags", "driver",
                           "-e", "nvidia_driver_allow_change=true", "-e", "a=b c"]
    assert lines[-1].endswith("ansible/ansible.cfg")


def test_provision_without_ansible_says_which_extra(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    result = run("provision", "-i", str(inventory), cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 2 and "pip install 'hpc-train[ansible]'" in result.stderr
    assert "Traceback" not in result.stderr
