"""The paths users, rendered scripts and queued jobs name stay where they were when the code moved
(docs/design.md, "Where each concern lives"): each is imported or run here as they use it."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120, **kwargs)


def test_user_code_imports_the_mapping_and_the_node_list_parser():
    code = ("import hpc_train.dist as dist, hpc_train.hostlist as hostlist; "
            "assert callable(dist.setup) and dist.DistEnv.from_environ({}).world_size == 1; "
            "assert hostlist.expand('gpu[01-02]') == ['gpu01', 'gpu02']; print('ok')")
    assert _python("-c", code).stdout.strip() == "ok"


def test_the_entrypoints_rendered_scripts_run_are_runnable_modules(tmp_path):
    train = _python("-m", "hpc_train.train", "--help")
    assert train.returncode == 0 and "python -m hpc_train.train" in train.stdout
    command = _python("-m", "hpc_train.command")
    assert command.returncode == 2 and "usage: python -m hpc_train.command --resolved" in command.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"launches": [], "python": sys.executable, "cwd": str(tmp_path)}))
    local = _python("-m", "hpc_train.local", str(plan))
    assert local.returncode == 0 and not plan.exists(), local.stderr  # the runner ran the (empty) plan


def test_a_queued_jobs_pickle_naming_the_old_callable_path_still_loads():
    from hpc_train.rank.callable import TrainJob

    # What an earlier version pickled: the class under its public path, hpc_train.train.callable.
    TrainJob.__module__ = "hpc_train.train.callable"
    try:
        queued = pickle.dumps(TrainJob("name: x\n", "/tmp/run"))
    finally:
        TrainJob.__module__ = "hpc_train.rank.callable"
    assert b"hpc_train.train.callable" in queued
    code = ("import pickle, sys; job = pickle.loads(sys.stdin.buffer.read()); "
            "print(type(job).__name__, job.run_dir, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], input=queued, capture_output=True, cwd=ROOT, timeout=120)
    assert out.stdout.decode().split() == ["TrainJob", "/tmp/run", "False"], out.stderr.decode()
