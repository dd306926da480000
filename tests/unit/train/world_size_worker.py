"""One rank of the same-math-at-any-world-size check of every loss and method (run by test_world_size.py under
the real torchrun; not collected).

Every configuration of :data:`CONFIGS` trains the real Trainer on the real digits (imbalance factor 25: 396
images, 6 global batches of 64 and a short one of 12, so at 4 ranks the last shares are 3 images each) for 3
epochs — class weights switching on at epoch 1 (DRW) or on from the start, SAM, ImbSAM, mixup, a second
stage — one after the other in one process group. The backbone is :func:`mlp`, a smooth network with a
synchronised BatchNorm (``sync_bn: true``) and no max-pooling or ReLU: nothing in it turns a rounding
difference into a discrete one (a max-pool whose argmax flips, a ReLU at 0), so what the ranks compute
differently — the order of the sums of the all-reduces — stays at float rounding, and any difference in the
math (a normaliser, a weight, a sample, a perturbation, a mixup partner, BatchNorm statistics moving twice per
SAM step or re-estimated in stage 2 that depend on the world size) shows as orders of magnitude more.
(The CNN with synchronised BatchNorm is checked by the hpc-train train runs of the same test file.)
Rank 0 saves every configuration's final weights for the test to compare across world sizes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

LOSSES = ("ce", "focal", "ldam", "balanced_softmax", "logit_adjusted", "label_aware_smoothing", "sigmoid_focal",
          "softmax_bce")
"""Every built-in loss (tests/unit/train/test_world_size.py checks this is all of config.LossName)."""


def _loss(name: str, **more: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"loss": {"name": name, **more}}
    if name == "ldam":
        cfg["model"] = {"classifier": "cosine"}
    return cfg


CONFIGS: dict[str, dict[str, Any]] = {
    **{f"{name}-drw": _loss(name, drw_epoch=1) for name in LOSSES},
    **{f"{name}-cb": _loss(name, reweight="class_balanced") for name in LOSSES},
    "ce-cb-batch_size": _loss("ce", reweight="class_balanced", normalise="batch_size"),
    "ldam-drw-sam": {**_loss("ldam", drw_epoch=1), "optim": {"sam_rho": 0.5}},
    "ce-cb-imbsam": {**_loss("ce", reweight="class_balanced"), "optim": {"sam_rho": 0.1, "sam_tail_below": 20}},
    "ce-cb-mixup": {**_loss("ce", reweight="class_balanced"), "mixup_alpha": 1.0},
    "ce-drw-mixup-sam": {**_loss("ce", drw_epoch=1), "mixup_alpha": 1.0, "optim": {"sam_rho": 0.5}},
    "two-stage": {**_loss("ce", reweight="class_balanced"), "data": {"val_fraction": 0.1},
                  "two_stage": {"crt_epochs": 1, "crt_lr": 0.05, "crt_reinit": False, "crt_max_norm": 0.1,
                                "crt_weight_decay": 0.1, "crt_loss": {"name": "label_aware_smoothing"}}},
}


def mlp(num_classes: int, in_channels: int, width: int = 32) -> nn.Module:
    """A smooth plug-in backbone: images → tanh(BN(W·x)) features (see the module docstring)."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 64, width), nn.BatchNorm1d(width), nn.Tanh())
    net.feature_dim = width
    return net


def job(name: str, world_size: int):
    from hpc_train.config import JobSpec, build, validate

    from .helpers import deep_update

    base = {"device": "cpu", "num_threads": 1, "deterministic": True, "sync_bn": True, "epochs": 3, "batch_size": 64,
            "log_every_steps": 1000, "keep_checkpoints": 1, "eval_batch_size": 512,
            "data": {"name": "digits-lt", "imbalance_factor": 25},
            "model": {"name": "tests.unit.train.world_size_worker:mlp"},
            "optim": {"lr": 0.05, "weight_decay": 5e-4},
            "schedule": {"name": "cosine", "warmup_epochs": 1}}
    return validate(build(JobSpec, {"name": name, "slurm": {"tasks_per_node": world_size, "gpus_per_node": 0},
                                    "train": deep_update(base, **CONFIGS[name])}))


def main() -> None:
    from hpc_train.rank.dist import DistEnv, init_process_group
    from hpc_train.train import launch
    from hpc_train.train.data import datasets
    from hpc_train.train.loop.context import RankContext
    from hpc_train.train.loop.engine import Trainer
    from hpc_train.train.observe import progress

    progress.plot_per_class = lambda *args, **kwargs: False  # 0.7 s of matplotlib per run; not what this checks
    out, names = Path(sys.argv[1]), sys.argv[2:] or list(CONFIGS)
    env = DistEnv.from_environ()
    if env.world_size > 1:
        init_process_group(env, backend="gloo", timeout_s=120)
    ctx = RankContext(env=env, device=torch.device("cpu"), rank=env.rank, world_size=env.world_size,
                      distributed=env.world_size > 1)
    steps = {}
    for name in names:
        spec = job(name, env.world_size)
        launch.configure_backends(spec, env, ctx.device)
        run_dir = out / f"w{env.world_size}" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(spec, ctx, datasets.load(spec.train.data), run_dir)
        trainer.fit()
        if env.rank == 0:
            torch.save(trainer.model.state_dict(), out / f"w{env.world_size}-{name}.pt")
        steps[name] = trainer.global_step
        if ctx.distributed:
            dist.barrier()
    if env.rank == 0:
        (out / f"w{env.world_size}-steps.json").write_text(json.dumps(steps))
    if ctx.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave as a rank of the trainer does (hpc_train.rank.lifecycle.exit_now): torch's gloo threads torn down at
    # interpreter exit abort a finished process now and then ("terminate called without an active exception").
    from hpc_train.rank.lifecycle import exit_now

    exit_now(0)
