"""What reaches a rank is checked like every other input (issue 28, item 5): a launcher variable that is not an
integer in its range is exit 2 with one line naming it — from the command wrapper (a real child, its exit path),
from `hpc-train env` and from the rank's own reading — never a traceback or a rendezvous on port 70000; a node list
is counted before it is expanded; `slurm.env` may not set the variables of the rank mapping; one `--sweep` key
twice is refused."""

import os
import subprocess
import sys
import time

import pytest

from hpc_train.config import NO_SITE, resolve_job
from hpc_train.errors import ConfigError, HpcTrainError
from hpc_train.rank.dist import DistEnv, launch_info
from hpc_train.runs import rundir
from tests.unit.hostile.helpers import assert_clean_refusal, invoke

BROKEN = [
    ({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT='x'"),
    ({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT='-1'"),
    ({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "99999999999999999999"}, "SLURM_RESTART_COUNT="),
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc'"),
    ({"SLURM_JOB_ID": "5;rm"}, "SLURM_JOB_ID="),
    ({"HPC_TRAIN_INSTANCE": "local:a.b"}, "HPC_TRAIN_INSTANCE='local:a.b'"),
    ({"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "1.5"}, "TORCHELASTIC_RESTART_COUNT='1.5'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT='0'"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
]


@pytest.mark.parametrize("variables, named", BROKEN)
def test_the_command_wrapper_refuses_a_broken_launcher_variable_in_one_line(tmp_path, variables, named):
    # Before: ValueError tracebacks (int('x')), or MASTER_PORT=70000 handed on to a rendezvous.
    (tmp_path / "job.yaml").write_text('name: x\ncommand: ["true"]\nslurm: {gpus_per_node: 0}\ntrain: {device: cpu}\n')
    env = {"PATH": os.environ["PATH"], "HPC_TRAIN_RUN_DIR": str(tmp_path), **variables}
    done = subprocess.run([sys.executable, "-m", "hpc_train.command", "--resolved", str(tmp_path / "job.yaml")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    failed = [e for e in rundir.read_events(tmp_path) if e["event"] == "failed"]
    assert len(failed) == 1 and named in failed[0]["reason"]


@pytest.mark.parametrize("variables, named", BROKEN + [({"HPC_TRAIN_SIGNAL_DELAY_S": "soon"},
                                                         "HPC_TRAIN_SIGNAL_DELAY_S='soon'")])
def test_hpc_train_env_refuses_a_broken_launcher_variable(monkeypatch, isolated_launch_env, variables, named):
    for key in ("HPC_TRAIN_INSTANCE", "TORCHELASTIC_RUN_ID", "HPC_TRAIN_RESTART"):
        monkeypatch.delenv(key, raising=False)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=named.split("=")[0]):
        DistEnv.from_environ()
        launch_info()
        rundir.instance_of()
    if set(variables) & {"MASTER_PORT", "SLURM_RESTART_COUNT", "HPC_TRAIN_SIGNAL_DELAY_S"}:
        assert_clean_refusal(invoke("env"), named)


def test_a_node_list_is_counted_before_it_is_expanded():
    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "gpu[0-99999999]"}
    started = time.monotonic()
    with pytest.raises(HpcTrainError, match="names 100,000,000 hosts"):
        DistEnv.from_environ(env)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("name", ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                                  "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID"])
def test_slurm_env_may_not_set_the_rank_mapping(name):
    # Before: accepted; every task then mapped itself to the same rank.
    with pytest.raises(ConfigError, match=f"slurm.env: {name} is a variable of the rank mapping"):
        resolve_job(None, site=NO_SITE, sets=[f"slurm.env.{name}=0"])


def test_slurm_env_keeps_the_export_lists_and_ordinary_names():
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.env.NCCL_DEBUG=INFO", "slurm.env.SLURM_EXPORT_ENV=ALL"])
    assert spec.slurm.env["NCCL_DEBUG"] == "INFO"


def test_the_same_sweep_key_twice_is_refused(tmp_path):
    # Before: the grid had both axes (a 2x2 sweep of one key, points with clashing values).
    result = invoke("submit", "--dry-run", "--cluster", "local", "--sweep", "train.seed=1,2", "--sweep",
                    "train.seed=3,4", cwd=tmp_path)
    assert_clean_refusal(result, "--sweep train.seed is given twice")
    assert list(tmp_path.iterdir()) == []
