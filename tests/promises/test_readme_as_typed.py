"""The README's and docs' shell lines as typed (issue 28, item 8): the inventory copy of the Ansible quick start runs
in a fresh directory (it needed an `inventories/` that a new user does not have)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _copy_line(doc: str) -> str:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return next(line.strip() for line in text.splitlines() if re.search(r"inventories/example\"? inventories/prod", line))


@pytest.mark.parametrize("doc", ["README.md", "docs/ansible.md"])
def test_the_inventory_copy_runs_as_typed_in_a_fresh_directory(tmp_path, doc):
    line = _copy_line(doc)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-ec", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "inventories" / "prod" / "group_vars" / "all" / "gpu_stack.yml").is_file()


def test_the_train_help_example_runs_as_typed(tmp_path):
    # The example was `hpc-train train digits_lt_demo --set train.epochs=2`, which its own warm-up refused (exit 2).
    from tests.cli_helpers import cli

    shown = cli("train", "--help").stdout
    example = next(line.split("#")[0].split()[2:] for line in shown.splitlines()
                   if line.strip().startswith("hpc-train train digits_lt_demo"))
    done = cli("train", *example, "--dry-run", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    refused = cli("train", "digits_lt_demo", "--set", "train.epochs=2", "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2 and "use --epochs N" in refused.stderr


def test_a_gpu_job_dry_run_without_slurm_or_gpus_prints_its_script(tmp_path, stub_slurm):
    # Was: `submit jobs/cifar100_lt_bs.yaml --dry-run` on a laptop without GPUs was refused (the local GPU check)
    # instead of printing the script the README promises for a job only a cluster can run.
    from hpc_train.local.plan import visible_gpus
    from tests.cli_helpers import cli

    stub_slurm.remove("sbatch")
    done = cli("submit", str(ROOT / "jobs" / "cifar100_lt_bs.yaml"), "--dry-run", cwd=tmp_path, env=stub_slurm.env())
    assert done.returncode == 0, done.stderr
    if visible_gpus() == 0:
        assert done.stdout.startswith("#!/bin/bash") and "no Slurm here: sbatch --test-only skipped" in done.stderr
        refused = cli("submit", str(ROOT / "jobs" / "cifar100_lt_bs.yaml"), cwd=tmp_path, env=stub_slurm.env())
        assert refused.returncode == 2 and "this machine has 0" in refused.stderr  # a real local submit still is
    assert list(tmp_path.iterdir()) == []


def test_submit_dry_run_json_prints_json(tmp_path, stub_slurm):
    # Was: `submit --dry-run --json` printed the text plan.
    import json

    from tests.cli_helpers import cli

    stub_slurm.remove("sbatch")
    for args in ([], ["--nodes", "2"]):
        done = cli("submit", "--dry-run", "--json", *args, cwd=tmp_path, env=stub_slurm.env())
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
        assert shown["dry_run"] is True and shown["cluster"] == ("slurm" if args else "local")
        assert ("#!/bin/bash" in shown["script"]) == bool(args) and done.stderr == ""
    assert list(tmp_path.iterdir()) == []


def test_resume_wait_prints_only_the_new_launch(tmp_path, stub_slurm):
    # Was: `submit --resume RUN --wait` printed the previous launches' whole rank-0 log again before the new one's.
    import sys

    from tests.cli_helpers import cli

    stub_slurm.remove("sbatch")
    script = tmp_path / "say.py"
    script.write_text("import os\nprint('launch', os.environ['HPC_TRAIN_RESTART'], flush=True)\n")
    first = cli("submit", "--cluster", "local", "--tasks-per-node", "1", "--name", "say", "--wait", "--",
                sys.executable, str(script), cwd=tmp_path, env=stub_slurm.env(), timeout=120)
    assert first.returncode == 0 and "launch 0" in first.stdout, first.stderr
    again = cli("submit", "--resume", "say", "--wait", cwd=tmp_path, env=stub_slurm.env(), timeout=120)
    assert again.returncode == 0, again.stderr
    assert "launch 0" not in again.stdout and "launch" in again.stdout, again.stdout
