"""Weight balancing (Alshammari et al., CVPR 2022) against its reference repository's own code,
ShadeAlsha/LTR-weight-balancing at HEAD e89f292, transcribed here from reading it (file and line cited) and
compared on random inputs: the stage-2 "CB loss" (``softmax_bce``), the ResNet-34 with the CIFAR stem
(``resnet34_cifar``, which ImbSAM trains too) and when MaxNorm projects. The projection itself is in
test_methods_reference.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from hpc_train.config import LossConfig  # noqa: E402
from hpc_train.train.model.losses import build_loss  # noqa: E402

COUNTS = [500, 210, 90, 40, 17, 7, 3]
C = len(COUNTS)


def _wb_cb_softmax_loss(labels, logits, samples_per_cls, no_of_classes, beta):
    """utils/class_balanced_loss.py l.73-94 (``CB_loss``, loss_type "softmax", as demo2_second-stage-training.py
    l.339-340 calls it with beta 0.9999): effective-number weights normalised to sum to C, each sample's weight
    (its target's) repeated over the classes, then binary cross-entropy of the softmax probabilities against the
    one-hot labels with those weights, the default mean over batch x classes."""
    effective_num = 1.0 - np.power(beta, samples_per_cls)
    weights = (1.0 - beta) / np.array(effective_num)
    weights = weights / np.sum(weights) * no_of_classes
    labels_one_hot = F.one_hot(labels, no_of_classes).to(logits.dtype)
    weights = torch.tensor(weights).to(logits.dtype)[None, :].repeat(labels_one_hot.shape[0], 1)
    weights = (weights * labels_one_hot).sum(1)[:, None].repeat(1, no_of_classes)
    pred = logits.softmax(dim=1)
    return F.binary_cross_entropy(input=pred, target=labels_one_hot, weight=weights)


def _batch(seed: int, n: int = 64, scale: float = 3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, C, generator=gen, dtype=torch.float64)
    return logits, torch.randint(0, C, (n,), generator=gen)


def _value_and_grad(fn, logits):
    logits = logits.clone().requires_grad_(True)
    value = fn(logits)
    value.backward()
    return value.detach(), logits.grad


@pytest.mark.parametrize("beta", [0.9999, 0.0])  # the demo's beta; beta 0 gives every class weight 1
def test_softmax_bce_is_weight_balancings_cb_loss(beta):
    cfg = LossConfig(name="softmax_bce", reweight="class_balanced", cb_beta=beta)
    ours = build_loss(cfg, COUNTS)
    for seed in range(5):
        logits, target = _batch(seed)
        want, want_grad = _value_and_grad(lambda z: _wb_cb_softmax_loss(target, z, COUNTS, C, beta), logits)
        got, got_grad = _value_and_grad(lambda z: ours(z, target), logits)
        assert float(got) == pytest.approx(float(want), rel=1e-12), seed
        assert torch.allclose(got_grad, want_grad, rtol=1e-10, atol=1e-15), seed


def test_softmax_bce_is_exact_where_a_probability_rounds_to_one():
    # A confident float32 row: p_0 = 1 - e^-25 rounds to 1, where the reference's log(1 - p) is -inf, clamped at
    # -100 (and the plain log1p(-p) would give a NaN gradient). Ours takes log(1 - p) from the logits: finite,
    # and the value the reference computes in float64, where 1 - p is still representable.
    logits, target = _batch(7, n=16, scale=1.0)
    logits[:, 0] = logits[:, 1:].logsumexp(dim=1) + 25.0
    target[:4] = 1
    cfg = LossConfig(name="softmax_bce", reweight="class_balanced")
    got, got_grad = _value_and_grad(lambda z: build_loss(cfg, COUNTS)(z, target), logits.float())
    assert torch.isfinite(got_grad).all()
    assert float(got) == pytest.approx(float(_wb_cb_softmax_loss(target, logits, COUNTS, C, cfg.cb_beta)), rel=1e-5)
    clamped = float(_wb_cb_softmax_loss(target, logits.float(), COUNTS, C, cfg.cb_beta))
    assert clamped > 2 * float(got)  # not vacuous: float32 probabilities lose 1 - p


def test_softmax_bce_gradient_is_the_small_one_the_recipe_is_tuned_for():
    # Not the class-balanced softmax CE (what the recipe used before): on C = 100 its logit gradient is tens of
    # times larger, which the recipe's lr 0.01 and weight decay 0.1 are not tuned for.
    counts = [max(1, int(500 * 0.01 ** (c / 99))) for c in range(100)]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 100, generator=gen, dtype=torch.float64)
    target = torch.randint(0, 100, (64,), generator=gen)
    bce = LossConfig(name="softmax_bce", reweight="class_balanced")
    ce = LossConfig(name="ce", reweight="class_balanced", normalise="batch_size")
    _, bce_grad = _value_and_grad(lambda z: build_loss(bce, counts)(z, target), logits)
    _, ce_grad = _value_and_grad(lambda z: build_loss(ce, counts)(z, target), logits)
    assert float(ce_grad.norm() / bce_grad.norm()) > 20


def test_the_weight_balancing_recipe_trains_stage_two_with_that_loss():
    from hpc_train.config import resolve_job

    from .helpers import REPO

    spec, _ = resolve_job(REPO / "jobs" / "cifar100_lt_wb.yaml", sets=["train.data.root=/nonexistent"])
    crt_loss = spec.train.two_stage.crt_loss
    assert (crt_loss.name, crt_loss.reweight, crt_loss.cb_beta) == ("softmax_bce", "class_balanced", 0.9999)
    assert (spec.train.two_stage.crt_lr, spec.train.two_stage.crt_weight_decay) == (0.01, 0.1)  # demo2 l.335-337


class _WbResnetEncoder(nn.Module):
    """utils/network_arch_resnet.py l.17-94 (``ResnetEncoder(34, isPretrained=False, embDimension=C,
    poolSize=4)``, as demo1/demo2 build it): torchvision's resnet34 (l.48), conv1 replaced by a 3x3 stride-1
    convolution (l.59), fc by a new nn.Linear(512, C) (l.67); forward (l.73-94) skips the max-pool and
    average-pools layer4's 4x4 map with avg_pool2d(x, 4)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        import torchvision

        self.encoder = torchvision.models.resnet34()
        self.encoder.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.encoder.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        e = self.encoder
        x = e.relu(e.bn1(e.conv1(x)))
        x = e.layer4(e.layer3(e.layer2(e.layer1(x))))
        x = F.avg_pool2d(x, 4)
        return e.fc(x.view(x.size(0), -1))


def test_resnet34_cifar_is_weight_balancings_resnet_encoder():
    from hpc_train.config import ModelConfig
    from hpc_train.train.model.models import build_model

    torch.manual_seed(0)
    reference = _WbResnetEncoder(100)
    torch.manual_seed(0)
    ours = build_model(ModelConfig(name="resnet34_cifar"), num_classes=100, in_channels=3)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(ours) == count(reference) == 21_328_292
    # Built in the same order from the same seed: the same initial weights, tensor for tensor (conv1 and the
    # classifier re-created after torchvision's init, PyTorch's defaults, as the reference re-creates them).
    theirs = {k.removeprefix("encoder.").replace("fc.", "classifier.", 1) if k.startswith("encoder.fc.")
              else "backbone." + k.removeprefix("encoder."): v for k, v in reference.state_dict().items()}
    mine = ours.state_dict()
    assert theirs.keys() == mine.keys()
    assert all(torch.equal(theirs[k], mine[k]) for k in mine)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    for train in (True, False):
        reference.train(train)
        ours.train(train)
        assert torch.allclose(ours(x), reference(x), rtol=1e-5, atol=1e-5), train


def test_maxnorm_projects_once_per_epoch_after_its_steps(tmp_path):
    """utils/trainval.py l.140-142: ``pgdFunc.PGD(model)`` once, after an epoch's train phase, not after each
    step. Seen from the weights each stage-2 step starts from (an optimizer pre-step hook): inside an epoch
    class vectors grow past the radius (no projection between steps), and every epoch after the first starts
    within it (the projection at the end of the one before)."""
    from hpc_train.rank.dist import DistEnv
    from hpc_train.train.data import datasets
    from hpc_train.train.loop.context import RankContext
    from hpc_train.train.loop.engine import Trainer

    from .helpers import DIGITS_QUICK, deep_update, make_spec

    spec = make_spec(deep_update(DIGITS_QUICK, epochs=1, keep_checkpoints=1, two_stage={
        "crt_epochs": 3, "crt_lr": 0.1, "crt_reinit": False, "crt_max_norm": 0.1, "crt_sampler": "instance"}))
    ctx = RankContext(env=DistEnv.from_environ(), device=torch.device("cpu"), rank=0, world_size=1, distributed=False)
    (tmp_path / "run").mkdir()
    trainer = Trainer(spec, ctx, datasets.load(spec.train.data), tmp_path / "run")
    starts: list[tuple[int, int, float]] = []  # (epoch, step in epoch, largest class-vector norm)
    setup_phase = trainer._setup_phase

    def setup_and_watch(phase: str, **kwargs) -> None:
        setup_phase(phase, **kwargs)
        if phase == "crt":
            trainer.optimizer.register_step_pre_hook(lambda *_: starts.append((
                trainer.epoch, trainer.step_in_epoch, float(trainer.model.classifier.weight.detach().norm(dim=1).max()))))

    trainer._setup_phase = setup_and_watch
    trainer.fit()
    radius = trainer.max_norm.radius
    assert trainer.steps_per_epoch > 2 and len(starts) == 3 * trainer.steps_per_epoch
    for epoch in (1, 2, 3):
        norms = [n for e, _, n in starts if e == epoch]
        if epoch < 3:  # (the last epoch's cosine lr, stepped per epoch, is 0: nothing moves in it)
            assert max(norms[1:]) > radius * 1.01, (epoch, radius, norms)  # grown between steps, not projected
        if epoch > 1:
            assert norms[0] <= radius * (1 + 1e-6), (epoch, radius, norms)  # projected at the previous epoch's end
    assert float(trainer.model.classifier.weight.detach().norm(dim=1).max()) <= radius * (1 + 1e-6)
