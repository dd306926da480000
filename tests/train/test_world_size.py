"""World size 1 is what it always was: the LDAM-DRW path (cosine classifier, LDAM, DRW switching on
mid-run, warm-up and a milestone, a short last batch every epoch) through the trainer gives bit for bit
the weights of a plain loop written here with the per-batch arithmetic it always had —
``F.cross_entropy(weight=w)``'s own weighted mean, the batch's augmentation drawn from
(seed, epoch, step, 0) — and no global-batch machinery."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpc_train.train import checkpoint as ckpt  # noqa: E402
from hpc_train.train import launch  # noqa: E402

from .helpers import deep_update, digits_lt_counts, make_spec  # noqa: E402

LDAM_DRW = {
    "epochs": 3, "batch_size": 32, "log_every_steps": 1000, "keep_checkpoints": 1,
    "data": {"name": "digits-lt", "imbalance_factor": 20},  # 417 images: 13 batches of 32 and one of 1
    "model": {"name": "small_cnn", "classifier": "cosine"},
    "loss": {"name": "ldam", "drw_epoch": 1},
    "optim": {"lr": 0.05, "weight_decay": 5e-4},
    "schedule": {"name": "multistep", "warmup_epochs": 1, "milestones": [2], "gamma": 0.1},
}


def _per_batch_loop(spec) -> dict:
    """The single-process step as it always was, written out: no global targets, no world-size factor."""
    import torch.nn.functional as F

    from hpc_train.train import datasets
    from hpc_train.train.engine import default_crop_padding, default_flip, init_model
    from hpc_train.train.losses import class_balanced_weights, ldam_margins
    from hpc_train.train.pipeline import DeviceImages
    from hpc_train.train.samplers import GlobalSampler, derive_seed
    from hpc_train.train.schedule import LrSchedule

    t = spec.train
    data = datasets.load(t.data)
    counts = [int(c) for c in data.train_counts]
    model = init_model(t, data)
    images = DeviceImages(data.train, torch.device("cpu"), mean=data.mean, std=data.std,
                          crop_padding=default_crop_padding(t, data), flip=default_flip(t, data), channels_last=False)
    sampler = GlobalSampler(data.train.labels, data.num_classes, name="instance", seed=derive_seed(t.seed, "main"))
    optimizer = torch.optim.SGD(model.parameters(), lr=t.optim.lr, momentum=t.optim.momentum,
                                weight_decay=t.optim.weight_decay)
    schedule = LrSchedule(t.schedule, t.optim.lr, t.epochs)
    margins = ldam_margins(counts, t.loss.ldam_max_margin).float()
    cb_weights = class_balanced_weights(counts, t.loss.cb_beta).float()
    model.train()
    for epoch in range(t.epochs):
        sequence = sampler.global_sequence(epoch)
        steps = -(-len(sequence) // t.batch_size)
        for step in range(steps):
            idx = sequence[step * t.batch_size:(step + 1) * t.batch_size]
            gen = torch.Generator().manual_seed(derive_seed("augment", t.seed, epoch, step, 0))
            x, y = images.apply(idx, images.draw(len(idx), gen))
            logits = model(x)
            adjusted = torch.where(F.one_hot(y, logits.shape[1]).bool(), logits - margins[None, :], logits)
            weight = cb_weights if epoch >= t.loss.drw_epoch else None
            loss = F.cross_entropy(t.loss.ldam_scale * adjusted, y, weight=weight)
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr(epoch, step, steps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.state_dict()


def test_world_size_one_is_bit_identical_to_the_per_batch_path(tmp_path):
    spec = make_spec(LDAM_DRW)
    assert sum(digits_lt_counts(20)) % LDAM_DRW["batch_size"] == 1  # a one-image last batch, every epoch
    assert launch.run(spec, run_dir=str(tmp_path / "run")).exit_code == 0
    trained, _ = ckpt.load_latest(tmp_path / "run")
    expected = _per_batch_loop(spec)
    assert trained["model"].keys() == expected.keys()
    different = [k for k, v in expected.items() if not torch.equal(trained["model"][k], v)]
    assert not different, different
    moved = make_spec(deep_update(LDAM_DRW, loss={"name": "ldam", "drw_epoch": 2}))  # not vacuous: DRW matters
    assert not torch.equal(_per_batch_loop(moved)["classifier.weight"], expected["classifier.weight"])
