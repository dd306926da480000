"""The user-command wrapper (``python -m hpc_train.command``), run as the real process a launcher starts: what
the command's process gets (issue 27: ``python`` is the job's interpreter; a torchrun worker sees its rank in
Slurm's variables, not the node's torchrun task).

The Slurm step here is its environment only (what slurmd gives the node's one torchrun task, then torchrun its
workers: SLURM_PROCID=<node>, SLURM_NTASKS=<nodes>); tests/real_cluster runs the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PRINT_ENV = "import json, os, sys; print(json.dumps({'python': sys.executable, 'env': dict(os.environ)}))"


def run_wrapper(tmp_path, job_yaml: str, environ: dict[str, str]) -> dict:
    (tmp_path / "job.yaml").write_text(job_yaml)
    base = {"PATH": "/usr/sbin:/sbin", "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # no python on this PATH
            "HPC_TRAIN_RUN_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "hpc_train.command", "--resolved", str(tmp_path / "job.yaml")],
                          env={**base, **environ}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def torchrun_worker_in_slurm_step(rank: int, *, nodes: int = 2, per_node: int = 2) -> dict[str, str]:
    node = rank // per_node
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(node), "SLURM_NTASKS": str(nodes), "SLURM_STEP_NUM_TASKS": str(nodes),
            "SLURM_NPROCS": str(nodes), "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": f"1(x{nodes})",
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})", "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_JOB_NODELIST": "gpu[01-02]",
            "RANK": str(rank), "LOCAL_RANK": str(rank % per_node), "WORLD_SIZE": str(nodes * per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node), "MASTER_ADDR": "gpu01",
            "MASTER_PORT": "24242", "TORCHELASTIC_RUN_ID": "4242"}


TORCHRUN_JOB = "name: t\ncommand: [{}, -c, \"{}\"]\nslurm: {{nodes: 2, tasks_per_node: 2, launcher: torchrun}}\n"


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_a_torchrun_worker_sees_its_rank_not_its_node_in_slurm_variables(tmp_path, rank):
    from hpc_train.rank.dist import DistEnv

    seen = run_wrapper(tmp_path, TORCHRUN_JOB.format(sys.executable, PRINT_ENV), torchrun_worker_in_slurm_step(rank))["env"]
    assert (seen["SLURM_PROCID"], seen["SLURM_LOCALID"], seen["SLURM_NODEID"]) == (str(rank), str(rank % 2), str(rank // 2))
    assert (seen["SLURM_NTASKS"], seen["SLURM_STEP_NUM_TASKS"], seen["SLURM_NPROCS"]) == ("4", "4", "4")
    assert seen["SLURM_TASKS_PER_NODE"] == seen["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    # A client reading only Slurm's variables gets the mapping torchrun gave (hpc-train's own reader as the client).
    slurm_only = {k: v for k, v in seen.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    mapped = DistEnv.from_environ(slurm_only)
    assert (mapped.source, mapped.rank, mapped.local_rank, mapped.world_size, mapped.node_rank) == \
        ("slurm", rank, rank % 2, 4, rank // 2)


def test_python_after_the_double_dash_is_the_job_interpreter_not_the_path_one(tmp_path):
    job = "name: t\ncommand: [python, -c, \"{}\"]\n".format(PRINT_ENV)
    seen = run_wrapper(tmp_path, job, {})  # PATH has no python at all: found on PATH, it was exit 127
    assert seen["python"] == sys.executable



def start_wrapper(tmp_path, job_yaml: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The wrapper as a launcher starts it: in the submit directory (``tmp_path/submit``), with the run directory
    ``tmp_path/run`` beside it (both made here when missing); the finished process and the run directory."""
    submit_dir, run_dir = tmp_path / "submit", tmp_path / "run"
    submit_dir.mkdir(exist_ok=True)
    run_dir.mkdir(exist_ok=True)
    (run_dir / "job.yaml").write_text(job_yaml)
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               "HPC_TRAIN_RUN_DIR": str(run_dir)}
    done = subprocess.run([sys.executable, "-m", "hpc_train.command", "--resolved", str(run_dir / "job.yaml")],
                          env=environ, cwd=submit_dir, capture_output=True, text=True, timeout=60)
    return done, run_dir


def test_a_command_runs_in_its_runs_work_directory_and_a_relative_script_is_the_submit_directorys(tmp_path):
    (tmp_path / "submit").mkdir()
    (tmp_path / "submit" / "client.py").write_text(
        "import json, os\nprint(json.dumps({'cwd': os.getcwd(), 'submit': os.environ['HPC_TRAIN_SUBMIT_DIR']}))\n")
    done, run_dir = start_wrapper(tmp_path, "name: t\ncommand: [python, client.py]\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"cwd": str(run_dir / "work"), "submit": str(tmp_path / "submit")}


def test_workdir_submit_runs_where_the_launcher_started_it(tmp_path):
    done, run_dir = start_wrapper(tmp_path, "name: t\nworkdir: submit\ncommand: [python, -c, 'import os; print(os.getcwd())']\n")
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "submit"), done.stderr
    assert not (run_dir / "work").exists()


@pytest.mark.parametrize("command, name", [(["/nonexistent/prog"], "/nonexistent/prog"),
                                           (["no-such-program-hpc-train"], "no-such-program-hpc-train"),
                                           (["python", "/nonexistent/train.py"], "/nonexistent/train.py")])
def test_a_missing_program_at_launch_is_exit_127_and_the_runs_reason(tmp_path, command, name):
    # Was: python's own exit 2 for a missing script ("bad configuration or data"); exec's bare OSError text.
    done, run_dir = start_wrapper(tmp_path, f"name: t\ncommand: {json.dumps(command)}\n")
    assert done.returncode == 127 and done.stderr.strip().splitlines()[-1] == f"hpc-train: program not found: {name}"
    events = [json.loads(line) for line in (run_dir / "state.jsonl").read_text().splitlines()]
    assert [(e["event"], e["exit_code"], e["reason"]) for e in events] == [("failed", 127, f"program not found: {name}")]


def test_a_planted_work_symlink_is_refused_not_followed(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "work").symlink_to(tmp_path / "elsewhere")
    done, _ = start_wrapper(tmp_path, "name: t\ncommand: [python, -c, 'open(\"x\", \"w\")']\n")
    assert done.returncode == 2 and "is not a directory (a symlink or a file)" in done.stderr, done.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []
