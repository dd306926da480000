"""Every `hpc-train` command the README shows runs, and exits 0: the commands of its code blocks, and the
complete ones quoted in its prose (not syntax lines such as `hpc-train logs RUN [-f]`). Where a command
would submit, it runs with --dry-run; Slurm is a stand-in on PATH (tests/conftest.py: StubSlurm), and the
run that `status`, `logs` and `cancel` name is submitted to it first."""

import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PLACEHOLDER = re.compile(r"\[|\b(?:JOB|RUN|INVENTORY|HOSTS|TAGS|KEY|VALUE|DIR|FILE|N|R)\b")


def readme_commands() -> list[str]:
    commands = []
    in_fence = False
    for line in README.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        text = line.strip()
        if (line.startswith("    ") or in_fence) and text.startswith("hpc-train "):
            commands.append(text)
    for quoted in re.findall(r"`(hpc-train [^`]+)`", README):
        if not PLACEHOLDER.search(quoted):
            commands.append(quoted)
    return list(dict.fromkeys(commands))


COMMANDS = readme_commands()


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 25, COMMANDS


@pytest.fixture(scope="module")
def place(tmp_path_factory, stub_slurm_module):
    """A directory like a clone's (jobs/ beside it), a site template dir, an inventory, a sweep file, an
    ansible-playbook stand-in, and the run the README's status/logs/cancel lines name."""
    work = tmp_path_factory.mktemp("readme")
    (work / "jobs").symlink_to(ROOT / "jobs")
    shutil.copytree(ROOT / "ansible" / "inventories" / "example", work / "inventories" / "prod")
    (work / "sweep.yaml").write_text("train.seed: [0, 1]\n")
    (work / "train.py").write_text("")  # the README's `-- python train.py`: submit checks the script is there
    (stub_slurm_module.bin / "ansible-playbook").write_text("#!/bin/sh\nexit 0\n")
    (stub_slurm_module.bin / "ansible-playbook").chmod(0o755)
    env = stub_slurm_module.env(HOME=str(work), HPC_TRAIN_STATE_DIR=str(work / ".state"))
    write_sweep_runs(work / "runs" / "lt-sweep")  # what the README's `report` line reads
    submitted = run(["hpc-train", "submit", "--nodes", "4", "--gpus", "8", "cifar100_lt_bs"], work, env)
    assert submitted.returncode == 0, submitted.stderr
    # It has run and ended: squeue no longer knows it, sacct does.
    stub_slurm_module.answer("squeue", stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    stub_slurm_module.answer("sacct", "4242|COMPLETED|0:0|00:10:00|gpu[01-04]|None\n")
    return work, env


def write_sweep_runs(group: Path) -> None:
    """Four finished local runs of a loss x seed sweep, in the run directory's formats (config.json, run.json,
    state.jsonl, metrics.jsonl); tests/real_cluster/test_commands.py checks the report's figures on real runs."""
    import json

    from hpc_train.config import resolve

    for i, (loss, seed) in enumerate([(l, s) for l in ("ce", "balanced_softmax") for s in (0, 1)]):
        run_dir = group / f"local-1_{i}"
        run_dir.mkdir(parents=True)
        spec = resolve(None, sets=[f"train.loss.name={loss}", f"train.seed={seed}"]).spec
        (run_dir / "config.json").write_text(json.dumps(spec.to_dict()))
        (run_dir / "job.yaml").write_text(json.dumps(spec.to_dict()))
        (run_dir / "run.json").write_text(json.dumps({"job_id": run_dir.name, "cluster": "local"}))
        (run_dir / "state.jsonl").write_text('{"event": "exit", "exit_code": 0}\n')
        record = {"epoch": 1, "global_step": 7, "phase": "main", "split": "test", "top1": 0.5 + seed / 10,
                  "balanced": 0.5, "many": 0.9, "medium": 0.5, "few": 0.1 * i}
        (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def run(argv, cwd, env):
    return cli(*argv[1:], cwd=cwd, env=env, timeout=300)  # argv[0] is the README's `hpc-train`


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command, place):
    work, env = place
    argv = shlex.split(command.replace("/etc/hpc-train/templates", str(work / "site-templates")), comments=True)
    if argv[1] == "submit" and "--dry-run" not in argv:
        argv.append("--dry-run")
    result = run(argv, work, env)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr
