"""front/submit.py: the cluster is chosen before anything is written, a submission goes to the backend that runs it,
and its runs are registered in the run index; front/follow.py follows them to their end (a real local run of a
command, start to finish)."""

from __future__ import annotations

import json

import pytest

from hpc_train.config import NO_SITE, resolve
from hpc_train.errors import ConfigError, JobFailedError, SubmitError
from hpc_train.front.follow import wait_for
from hpc_train.front.submit import choose_cluster, submit
from hpc_train.runs import index


def _resolved(*sets: str, command: tuple[str, ...] = ("true",)):
    return resolve(None, sets=("slurm.gpus_per_node=0", *sets), flags={"command": command, "name": "cmd"},
                   site=NO_SITE)


def test_auto_runs_here_without_slurm_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    spec = _resolved().spec
    assert choose_cluster("auto", spec) == ("local", "Slurm not found (no 'sbatch' on PATH): running locally on this machine")
    assert choose_cluster("local", spec) == ("local", "")
    with pytest.raises(ConfigError, match=r"^2 nodes requested but Slurm is not available; a local run uses one node"):
        choose_cluster("auto", _resolved("slurm.nodes=2").spec)


def test_slurm_needs_all_of_its_tools(stub_slurm, monkeypatch):
    monkeypatch.setenv("PATH", stub_slurm.env()["PATH"])
    spec = _resolved().spec
    assert choose_cluster("auto", spec) == ("slurm", "")
    stub_slurm.remove("srun")
    with pytest.raises(SubmitError, match=r"^sbatch is not complete here: srun not on PATH"):
        choose_cluster("auto", spec)


@pytest.mark.timeout(120)
def test_a_local_submission_is_registered_and_followed_to_its_end(tmp_path, monkeypatch, isolated_launch_env):
    monkeypatch.chdir(tmp_path)
    result = submit(_resolved(), cluster="local", cwd=tmp_path)
    assert result.cluster == "local" and result.run_name == f"cmd/{result.job_id}"
    assert [r.run_dir for r in index.find_runs(tmp_path / "elsewhere", tmp_path)] == [tmp_path / result.run_dir]
    (status,) = wait_for(result, poll_s=0.1)
    assert status["state"] == "completed"
    assert json.loads((tmp_path / result.run_dir / "run.json").read_text())["launcher_pid"] > 0

    failing = submit(_resolved(command=("false",)), cluster="local", cwd=tmp_path)
    with pytest.raises(JobFailedError, match=rf"^cmd/{failing.job_id} failed: "):
        wait_for(failing, poll_s=0.1)
