"""local/plan.py: what a local submit would run (the plan ``--dry-run`` prints), the run ids, the refusal of a GPU
job on a machine without GPUs, and the keys a local run ignores."""

from __future__ import annotations

import os
import re
import shlex
import sys

import pytest

from hpc_train.config import NO_SITE, resolve
from hpc_train.errors import ConfigError
from hpc_train.local import plan


def _resolved(*sets: str, command: tuple[str, ...] | None = None):
    return resolve(None, sets=sets, flags={"command": command, "name": "t" if command else None}, site=NO_SITE)


def test_the_plan_is_one_line_per_rank_with_its_environment_and_log(tmp_path):
    resolved = _resolved("slurm.gpus_per_node=0", "slurm.tasks_per_node=2", "slurm.env={A: 'x y'}",
                         command=("python", "train.py", "--lr", "0.1"))
    text = plan.plan_text(resolved, [tmp_path / "run"])
    lines = text.splitlines()
    assert lines[0].startswith("# t: 2 local rank(s) in ") and "time limit" in lines[0]
    assert "export A='x y'" in lines and "# every rank becomes: python train.py --lr 0.1" in lines
    ranks = [line for line in lines if line.startswith("RANK=")]
    assert [shlex.split(line)[0] for line in ranks] == ["RANK=0", "RANK=1"]
    assert all(f"{shlex.quote(sys.executable)} -u -m hpc_train.command --resolved" in line for line in ranks)
    assert ranks[1].endswith(str(tmp_path / "run" / "logs" / "rank-1.log"))


def test_run_ids_name_the_submission_and_number_a_sweeps_points():
    (one,) = plan.new_run_ids(1)
    assert re.fullmatch(rf"local-\d{{8}}-\d{{6}}-{os.getpid()}", one)
    points = plan.new_run_ids(3)
    base = points[0].rsplit("_", 1)[0]
    assert points == [f"{base}_{i}" for i in range(3)] and re.fullmatch(r"local-\d{8}-\d{6}-\d+", base)


def test_a_gpu_job_is_refused_on_a_machine_without_gpus_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(plan, "visible_gpus", lambda: 0)
    with pytest.raises(ConfigError, match=r"^--gpus 2 \(slurm.gpus_per_node\) asks for 2 GPU\(s\), but this machine has 0"):
        plan.check_devices(_resolved("slurm.gpus_per_node=2").spec)
    plan.check_devices(_resolved("slurm.gpus_per_node=2", "train.device=cpu").spec)  # said plainly: CPU ranks
    plan.check_devices(_resolved("slurm.gpus_per_node=2", command=("true",)).spec)  # a command picks its device


def test_a_local_run_says_which_cluster_only_keys_it_ignores():
    spec = _resolved("slurm.gpus_per_node=0", "slurm.partition=a100", "slurm.modules=[cuda]").spec
    # In the schema's order (config/slurm_options.py derives the list from the fields).
    assert plan.ignored_keys(spec) == ["slurm.partition", "slurm.modules"]
    assert plan.local_note(spec).startswith("running locally: slurm.partition, slurm.modules ignored")
    assert plan.local_note(_resolved("slurm.gpus_per_node=0").spec) == ""
