"""One rank of the DDP-equivalence check of the captured step's all-reduce (run by test_grad_sync.py).

Every rank builds the same seeded model three times and takes two optimizer steps on its own share of
a global batch with :class:`~hpc_train.train.loop.step.TrainStep`: through DDP (as the eager path runs at
world size > 1), through :class:`~hpc_train.train.loop.step.GradAllReduce` (what a CUDA graph replays), and
through GradAllReduce without its buffer broadcast (a control the test must tell apart). BatchNorm is
per rank, as DDP leaves it without SyncBatchNorm. It saves every path's gradients, weights and
buffers after each step for the test to compare.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc_train.config import LossConfig, ModelConfig, OptimConfig, TrainConfig
from hpc_train.rank.dist import DistEnv, init_process_group
from hpc_train.train.loop.schedule import EpochRates
from hpc_train.train.loop.step import GradAllReduce, StepState, TrainStep, build_optimizer
from hpc_train.train.model.losses import build_loss
from hpc_train.train.model.models import build_model

CLASSES, BATCH = 5, 24


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    env = DistEnv.from_environ()
    init_process_group(env, backend="gloo", timeout_s=60)
    world = env.world_size
    cfg = TrainConfig(model=ModelConfig(name="small_cnn"), optim=OptimConfig(lr=0.1, weight_decay=5e-4),
                      loss=LossConfig(name="ce", reweight="class_balanced"))
    torch.manual_seed(0)
    base = build_model(cfg.model, num_classes=CLASSES, in_channels=3)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, BATCH, 3, 8, 8, generator=gen) * 2 + 1  # two global batches
    y = torch.randint(0, CLASSES, (2, BATCH), generator=gen)
    criterion = build_loss(cfg.loss, [40, 20, 10, 5, 2], world)
    results = {}
    for name in ("ddp", "all_reduce", "no_broadcast"):
        model = copy.deepcopy(base).train()
        state, rates = StepState.on(torch.device("cpu")), EpochRates(torch.device("cpu"))
        rates.set_epoch([0.1, 0.05], 0)
        optimizer = build_optimizer(cfg, list(model.parameters()), rates.tensor, captured=True)
        sync = None if name == "ddp" else GradAllReduce(model, world)
        if name == "no_broadcast":
            sync.before_forward = lambda: None
        step = TrainStep(forward=DDP(model) if name == "ddp" else model, criterion=criterion, optimizer=optimizer,
                         state=state, rates=rates, autocast=contextlib.nullcontext, scaler=torch.amp.GradScaler("cpu", enabled=False),
                         grad_sync=sync)
        seen = []
        for s in range(2):
            mine = slice(env.rank, None, world)
            step.compute(x[s][mine], y[s][mine], y[s])
            seen.append({"grads": [p.grad.clone() for p in model.parameters()],
                         "params": [p.detach().clone() for p in model.parameters()],
                         "buffers": {k: b.clone() for k, b in model.named_buffers()}})
        results[name] = seen
    torch.save(results, out / f"rank{env.rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave as a rank of the trainer does (hpc_train.rank.lifecycle.exit_now): torch's gloo threads torn down at
    # interpreter exit abort a finished process now and then ("terminate called without an active exception").
    from hpc_train.rank.lifecycle import exit_now

    exit_now(0)
