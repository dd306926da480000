"""Shared helpers of the training tests: job files, rank launchers, independent reference numbers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
PYTHON = sys.executable


def write_job(path: Path, train: dict[str, Any], *, tasks: int = 1, name: str = "t", **slurm: Any) -> Path:
    """A job file in the JobSpec schema (CPU, ``tasks`` ranks on one node)."""
    job = {"name": name, "runs_dir": str(path.parent / "runs"),
           "slurm": {"nodes": 1, "gpus_per_node": 0, "tasks_per_node": tasks, **slurm},
           "train": {"device": "cpu", "num_threads": 1, **train}}
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a rank process: no Slurm or torchrun variables leaking in from outside, an
    empty site file, one CPU thread, the repository importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_")) and k not in (
               "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GROUP_RANK", "NODE_RANK", "HPC_TRAIN_RUN_DIR")}
    site = tmp / "site.yaml"
    if not site.exists():
        site.write_text("{}\n")
    env.update({"HPC_TRAIN_SITE": str(site), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(extra)
    return env


def launch_ranks(args: list[str], world_size: int, tmp: Path, *, log_prefix: str,
                 env_extra: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start ``python -m hpc_train.train ARGS`` as ``world_size`` torchrun-style ranks on this machine
    (real processes, gloo). stdout/stderr go to ``<log_prefix>-<rank>.out/.err``; rank 0's stderr is
    also piped when ``log_prefix`` ends with ``+pipe``."""
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        env = clean_env(tmp, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                        **(env_extra or {}))
        out = open(f"{log_prefix}-{rank}.out", "w")
        err = open(f"{log_prefix}-{rank}.err", "w")
        procs.append(subprocess.Popen([PYTHON, "-m", "hpc_train.train", *args], cwd=REPO, env=env,
                                      stdout=out, stderr=err))
    return procs


def wait_all(procs: list[subprocess.Popen], timeout_s: float = 240) -> list[int]:
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return codes


def ldam_counts(n_max: float, num_classes: int, imbalance_factor: float) -> list[int]:
    """LDAM-DRW's ``get_img_num_per_cls`` ('exp'), written out again here so the tests do not check the
    package against itself."""
    imb_factor = 1.0 / imbalance_factor
    return [int(n_max * (imb_factor ** (cls_idx / (num_classes - 1.0)))) for cls_idx in range(num_classes)]


def digits_lt_counts(imbalance_factor: float, test_per_class: int = 50) -> list[int]:
    """digits-lt's documented construction: n_max is the smallest class pool after holding out
    ``test_per_class`` images per class."""
    import numpy as np
    from sklearn.datasets import load_digits

    per_class = np.bincount(load_digits().target)
    return ldam_counts(int(per_class.min()) - test_per_class, 10, imbalance_factor)


def steps_per_epoch(num_images: int, batch_size: int) -> int:
    """Global batches of an epoch, the last one short: the same at every world size."""
    return -(-num_images // batch_size)


def make_spec(train: dict[str, Any], *, tasks: int = 1, name: str = "t", runs_dir: str = "runs", **slurm: Any):
    """A validated JobSpec (CPU, one thread per rank) from plain dicts, as a job file would give."""
    from hpc_train.config import JobSpec, build, validate

    return validate(build(JobSpec, {
        "name": name, "runs_dir": runs_dir,
        "slurm": {"nodes": 1, "gpus_per_node": 0, "tasks_per_node": tasks, **slurm},
        "train": {"device": "cpu", "num_threads": 1, **train},
    }))


DIGITS_QUICK = {
    "epochs": 4, "batch_size": 32, "log_every_steps": 1000,
    "data": {"name": "digits-lt", "imbalance_factor": 20},
    "model": {"name": "small_cnn"}, "loss": {"name": "ce"},
    "optim": {"lr": 0.05, "weight_decay": 5e-4}, "schedule": {"name": "cosine"},
}
"""A few seconds of single-process training on the real digits."""


def deep_update(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
