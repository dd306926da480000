"""The hostile-input suite, part two (issue 28): flags, --set/--sweep values and launcher variables a careless
script or a hostile caller hands hpc-train. Each is a clean refusal (exit 2, one or two lines, no traceback) with
nothing written where it ran and no Slurm tool called (the stand-ins record every call)."""

from __future__ import annotations

import pytest

from hpc_train.errors import HpcTrainError
from hpc_train.rank.dist import DistEnv, launch_info
from hpc_train.runs import rundir
from tests.unit.hostile.helpers import assert_clean_refusal, invoke, snapshot

pytestmark = pytest.mark.timeout(30)

FLAGS = [
    ["--nodes", "0"], ["--nodes", "-1"], ["--nodes", "x"], ["--nodes", "99999999999999999999"], ["--gpus", "-1"],
    ["--gpus", "1.5"], ["--time", "soon"], ["--time", "-5"], ["--time", "1:99:99:99"], ["--epochs", "0"],
    ["--epochs", "-3"], ["--epochs", "nan"], ["--set", "train.epochs=0"], ["--set", "train.epochs"],
    ["--set", "=1"], ["--set", "no.such.key=1"], ["--set", "train.epochs=1e9999"], ["--set", "train.lr=nan"],
    ["--set", "train.lr=-inf"], ["--set", "name=a/b"], ["--set", "name=../x"], ["--set", "name="],
    ["--set", "name=x\ny"], ["--set", "slurm.env.BASH_ENV=$(id)"], ["--set", "slurm.env.RANK=0"],
    ["--set", "slurm.env.SLURM_PROCID=0"], ["--set", "slurm.env.MASTER_ADDR=evil"], ["--set", "slurm.env.1X=1"],
    ["--set", "slurm.extra_sbatch.nodes=9"], ["--set", "runs_dir=%x"], ["--sweep", "train.seed"],
    ["--sweep", "train.seed="], ["--sweep", "train.seed=1,2", "--sweep", "train.seed=3"],
    ["--sweep", "no.such=1,2"], ["--sweep", "train.epochs=0,1"], ["--sweep", "=1,2"], ["--pack", "0"],
    ["--pack", "-1"], ["--chain", "-1"], ["--max-parallel", "0"], ["--runs-dir", "/proc/x%"],
    ["--cluster", "nope"], ["--launcher", "mpirun"], ["--resume", ""], ["--resume", "/"], ["--resume", "_*"],
    ["--resume", "nope"], ["--nosuchflag"], ["no-such-job-file.yaml"], ["/dev/zero"], ["/etc"],
]


SUBMIT_ONLY = ("--resume", "--pack", "--chain", "--max-parallel", "--cluster")
CASES = [(["submit", "--dry-run"], args) for args in FLAGS] + [(["render"], a) for a in FLAGS if a[0] not in SUBMIT_ONLY]


@pytest.mark.parametrize("command, args", CASES, ids=[f"{c[0]} {' '.join(a)[:40]}" for c, a in CASES])
def test_a_bad_flag_or_value_is_a_clean_refusal_with_nothing_written(tmp_path, on_stub_path, command, args):
    before = snapshot(tmp_path)
    result = invoke(*command, *args, cwd=tmp_path)
    assert_clean_refusal(result)
    assert snapshot(tmp_path) == before
    assert on_stub_path.calls("sbatch") == [] and on_stub_path.calls("scancel") == []


LAUNCHER = [
    {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": " "}, {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "0x10"},
    {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1e3"}, {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "٣"},
    {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1000001"}, {"SLURM_JOB_ID": " 5"}, {"SLURM_JOB_ID": "5_"},
    {"SLURM_JOB_ID": "_5"}, {"SLURM_JOB_ID": "5_x"}, {"SLURM_JOB_ID": "5\n6"}, {"SLURM_JOB_ID": "-5"},
    {"SLURM_JOB_ID": "1" * 30}, {"HPC_TRAIN_INSTANCE": "local:x."}, {"HPC_TRAIN_INSTANCE": "local:x.-1"},
    {"HPC_TRAIN_INSTANCE": "local:x.9999999999"}, {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "x"},
    {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "-0.0"}, {"MASTER_PORT": "65536"},
    {"MASTER_PORT": "-1"}, {"MASTER_PORT": " "}, {"MASTER_PORT": "22 "}, {"MASTER_PORT": "0x50"},
    {"MASTER_PORT": "8080/tcp"}, {"HPC_TRAIN_SIGNAL_DELAY_S": "-1"}, {"HPC_TRAIN_SIGNAL_DELAY_S": "1.5"},
    {"HPC_TRAIN_SIGNAL_DELAY_S": "99999999999"}, {"HPC_TRAIN_RESTART": "x"}, {"HPC_TRAIN_EXIT_REQUEUE": "0"},
    {"HPC_TRAIN_EXIT_REQUEUE": "256"},
    {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7",
     "SLURM_JOB_NODELIST": "n[0-999999]x[0-999999]"},
    {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7",
     "SLURM_JOB_NODELIST": "n[5-1]"},
    {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7",
     "SLURM_JOB_NODELIST": "n[1-"},
]


@pytest.mark.parametrize("variables", LAUNCHER, ids=[repr(v)[:50] for v in LAUNCHER])
def test_a_broken_launcher_variable_is_exit_2_naming_it(monkeypatch, isolated_launch_env, variables):
    for key in ("HPC_TRAIN_INSTANCE", "TORCHELASTIC_RUN_ID", "HPC_TRAIN_RESTART", "SLURM_STEP_ID", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(HpcTrainError) as refused:
        DistEnv.from_environ()
        launch_info()
        rundir.instance_of()
    assert refused.value.exit_code == 2 and len(str(refused.value).splitlines()) <= 2
    named = [k for k in variables if k in str(refused.value)] or ["node list"]
    assert named and any(n in str(refused.value) for n in named), str(refused.value)
