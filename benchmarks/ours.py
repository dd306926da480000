"""Our side of the benchmarks: the trainer of ``hpc_train.train`` on the LDAM-DRW recipe
(``jobs/cifar10_lt_ldam_drw.yaml``: ResNet-32 with a cosine classifier, LDAM loss, SGD 0.9, lr 0.1,
wd 2e-4, batch 128, 5 warm-up epochs), fed an in-memory CIFAR-shaped data set instead of the CIFAR
files, set up the way ``launch.run`` sets up a rank (threads, device), minus the run-directory files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import REPO

RECIPE = REPO / "jobs" / "cifar10_lt_ldam_drw.yaml"


def recipe_spec(*, device: str = "cpu", world_size: int = 1, **train_overrides: Any):
    """The recipe's JobSpec on ``device`` with ``world_size`` ranks on one node, plus overrides of
    ``train.*`` given as nested dicts (``amp="bf16"``, ``data={"num_workers": 0}``)."""
    from hpc_train.config import JobSpec, build, deep_merge, load_yaml_file, validate

    job = load_yaml_file(RECIPE)
    gpus = world_size if device == "cuda" else 0
    job = deep_merge(job, {"slurm": {"nodes": 1, "gpus_per_node": gpus, "tasks_per_node": world_size},
                           "train": {"device": device, **train_overrides}})
    return validate(build(JobSpec, job))


def build_trainer(spec, data, run_dir: Path, *, rank: int = 0, world_size: int = 1):
    """A Trainer for this rank over ``data`` (a ``DataSource``), with threads and backend switches set
    exactly as ``launch.run`` sets them before it builds the trainer."""
    import torch

    from hpc_train.rank.dist import DistEnv
    from hpc_train.train.launch import configure_backends
    from hpc_train.train.loop.context import RankContext
    from hpc_train.train.loop.engine import Trainer

    env = DistEnv.from_environ()
    device = torch.device("cuda", torch.cuda.current_device()) if spec.train.device == "cuda" else torch.device("cpu")
    configure_backends(spec, env, device)
    ctx = RankContext(env=env, device=device, rank=rank, world_size=world_size, distributed=world_size > 1)
    run_dir.mkdir(parents=True, exist_ok=True)
    return Trainer(spec, ctx, data, run_dir)


def train_one_epoch(trainer) -> int:
    """One training epoch of our trainer (its data path included; no evaluation, no checkpoint).
    Returns the number of images all ranks together trained on."""
    total = trainer.sampler.num_samples
    skipped = min(total, trainer.step_in_epoch * trainer.cfg.batch_size)  # a warm-up may start mid-epoch
    trainer.train_epoch()
    return total - skipped
