"""One rank of the distributed sampler/evaluation check (run by test_distributed.py, not collected).

Every rank builds the same small synthetic long-tailed set and the same model, evaluates it with the
Trainer's real evaluation (unpadded shard + all-reduced per-class counts) and records its share of every
global batch of every sampler; rank 0 gathers everything and saves it for the test to compare across
world sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hpc_train.config import JobSpec, build, validate
from hpc_train.rank.dist import DistEnv, init_process_group
from hpc_train.train.data import datasets
from hpc_train.train.data.samplers import GlobalSampler
from hpc_train.train.loop.context import RankContext
from hpc_train.train.loop.engine import Trainer

SAMPLERS = ("instance", "class_balanced", "sqrt", "progressive", "class_aware")
EPOCHS = (0, 1, 2)
SAMPLER_BATCH = 41
"""125 training images = 3 batches of 41 and one of 2: at 3 ranks one rank holds none of the last."""


def spec(world_size: int) -> JobSpec:
    return validate(build(JobSpec, {
        "slurm": {"tasks_per_node": world_size},
        "train": {"device": "cpu", "num_threads": 1, "batch_size": 12, "eval_batch_size": 8,
                  "data": {"name": "synthetic-lt", "num_classes": 7, "max_per_class": 44, "imbalance_factor": 10,
                           "test_per_class": 11, "image_size": 8},
                  "model": {"name": "small_cnn"}},
    }))


def perturb(model: torch.nn.Module) -> None:
    """Give the untrained model a classifier with spread-out predictions (seeded), so per-class
    accuracies differ between classes and a wrong reduction cannot hide."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.randn(model.classifier.weight.shape, generator=gen) * 3)
        model.classifier.bias.copy_(torch.randn(model.classifier.bias.shape, generator=gen))


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    env = DistEnv.from_environ()
    distributed = env.world_size > 1
    if distributed:
        init_process_group(env, backend="gloo", timeout_s=60)
    job = spec(env.world_size)
    data = datasets.load(job.train.data)
    ctx = RankContext(env=env, device=torch.device("cpu"), rank=env.rank, world_size=env.world_size,
                      distributed=distributed)
    trainer = Trainer(job, ctx, data, out / f"run-w{env.world_size}-r{env.rank}")
    perturb(trainer.model)
    correct, count = trainer.evaluate("test", trainer.heads())["plain"]
    shards = {}
    for name in SAMPLERS:
        sampler = GlobalSampler(data.train.labels, data.num_classes, name=name, seed=5, progressive_epochs=3,
                                batch_size=SAMPLER_BATCH)
        for epoch in EPOCHS:
            shards[(name, epoch)] = [idx.tolist() for idx, _ in sampler.batches(epoch, env.rank, env.world_size,
                                                                                    SAMPLER_BATCH)]
    mine = {"rank": env.rank, "shards": shards}
    gathered = [None] * env.world_size
    if distributed:
        dist.all_gather_object(gathered, mine)
    else:
        gathered = [mine]
    if env.rank == 0:
        torch.save({"correct": correct, "count": count, "ranks": gathered, "train_labels": data.train.labels.tolist()},
                   out / f"world{env.world_size}.pt")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave as a rank of the trainer does (hpc_train.rank.lifecycle.exit_now): torch's gloo threads torn down at
    # interpreter exit abort a finished process now and then ("terminate called without an active exception").
    from hpc_train.rank.lifecycle import exit_now

    exit_now(0)
