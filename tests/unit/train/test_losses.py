"""Loss values against references computed by hand with ``math`` (no torch in the expectations)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hpc_train.config import LossConfig  # noqa: E402
from hpc_train.train.model.losses import (BalancedSoftmaxLoss, LogitAdjustedLoss, build_loss, class_balanced_weights,
                                          ldam_margins, log_prior, posthoc_adjust)

LOGITS = [[2.0, 1.0, 0.0], [0.5, 0.5, 3.0], [-1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]
TARGETS = [0, 2, 1, 1]
COUNTS = [100, 10, 1]


def _log_softmax(row: list[float]) -> list[float]:
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


def _ce(rows, targets, weights=None):
    """Weighted mean CE as F.cross_entropy defines it: sum w_y * ce / sum w_y."""
    w = weights or [1.0] * len(rows[0])
    num = sum(-w[y] * _log_softmax(r)[y] for r, y in zip(rows, targets))
    return num / sum(w[y] for y in targets)


def _loss(name: str, **kw) -> torch.nn.Module:
    return build_loss(LossConfig(name=name, **kw), COUNTS)


def _value(loss: torch.nn.Module, logits=LOGITS, targets=TARGETS) -> float:
    return float(loss(torch.tensor(logits, dtype=torch.float64), torch.tensor(targets)))


def test_cross_entropy_and_label_smoothing():
    assert _value(_loss("ce")) == pytest.approx(_ce(LOGITS, TARGETS), rel=1e-12)
    eps = 0.1
    by_hand = sum((1 - eps) * -_log_softmax(r)[y] + eps * sum(-v for v in _log_softmax(r)) / 3
                  for r, y in zip(LOGITS, TARGETS)) / len(TARGETS)
    assert _value(_loss("ce", label_smoothing=eps)) == pytest.approx(by_hand, rel=1e-12)


def test_class_balanced_weights_by_hand():
    beta = 0.999
    raw = [(1 - beta) / (1 - beta ** n) for n in (1000, 100, 10)]
    expected = [3 * r / sum(raw) for r in raw]
    got = class_balanced_weights([1000, 100, 10], beta).tolist()
    assert got == pytest.approx(expected, rel=1e-12)
    assert sum(got) == pytest.approx(3.0)
    # β → 0 gives equal weights; with β = 0.9999 (DRW) the weights approach inverse frequency.
    assert class_balanced_weights([1000, 100, 10], 0.0).tolist() == pytest.approx([1, 1, 1])
    w = class_balanced_weights([5000, 50], 0.9999).tolist()
    assert 40 < w[1] / w[0] < 100  # 1/n would be 100


def test_class_balanced_reweighting_and_drw_switch():
    beta = 0.9999
    raw = [(1 - beta) / (1 - beta ** n) for n in COUNTS]
    w = [3 * r / sum(raw) for r in raw]
    weighted = _loss("ce", reweight="class_balanced", cb_beta=beta)
    assert _value(weighted) == pytest.approx(_ce(LOGITS, TARGETS, w), rel=1e-12)
    drw = _loss("ce", drw_epoch=160, cb_beta=beta)
    drw.set_epoch(159)
    assert _value(drw) == pytest.approx(_ce(LOGITS, TARGETS), rel=1e-12)  # plain before the switch
    drw.set_epoch(160)
    assert _value(drw) == pytest.approx(_ce(LOGITS, TARGETS, w), rel=1e-12)


def test_focal_is_per_sample():
    gamma = 2.0
    per_sample = []
    for r, y in zip(LOGITS, TARGETS):
        logp = _log_softmax(r)[y]
        per_sample.append((1 - math.exp(logp)) ** gamma * -logp)
    assert _value(_loss("focal", focal_gamma=gamma)) == pytest.approx(sum(per_sample) / 4, rel=1e-12)
    # The pre-fix LDAM-DRW bug applied the focal term to the batch-mean CE; that is a different number.
    mean_ce = _ce(LOGITS, TARGETS)
    assert _value(_loss("focal", focal_gamma=gamma)) != pytest.approx((1 - math.exp(-mean_ce)) ** gamma * mean_ce)
    # γ = 0 is plain cross-entropy.
    assert _value(_loss("focal", focal_gamma=0.0)) == pytest.approx(_ce(LOGITS, TARGETS), rel=1e-12)


def test_ldam_margins_and_value():
    margins = ldam_margins(COUNTS, 0.5).tolist()
    expected = [0.5 * n ** -0.25 / 1 ** -0.25 for n in COUNTS]  # rarest class (n=1) gets the max margin
    assert margins == pytest.approx(expected, rel=1e-12)
    assert margins[0] / margins[1] == pytest.approx((10 / 100) ** 0.25, rel=1e-12)
    s = 30.0
    shifted = [[s * (v - (margins[y] if c == y else 0.0)) for c, v in enumerate(r)] for r, y in zip(LOGITS, TARGETS)]
    assert _value(_loss("ldam", ldam_max_margin=0.5, ldam_scale=s)) == pytest.approx(_ce(shifted, TARGETS), rel=1e-12)


def test_balanced_softmax_and_logit_adjusted_by_hand():
    bs_rows = [[v + math.log(n) for v, n in zip(r, COUNTS)] for r in LOGITS]
    assert _value(_loss("balanced_softmax")) == pytest.approx(_ce(bs_rows, TARGETS), rel=1e-12)
    tau, total = 0.5, sum(COUNTS)
    la_rows = [[v + tau * math.log(n / total) for v, n in zip(r, COUNTS)] for r in LOGITS]
    assert _value(_loss("logit_adjusted", tau=tau)) == pytest.approx(_ce(la_rows, TARGETS), rel=1e-12)


def test_balanced_softmax_equals_logit_adjustment_at_tau_one():
    # Independent implementations (one adds log n_c, the other τ·log π_c); at τ = 1 the logits they
    # feed to the softmax differ by log N in every class, so loss and gradient are the same.
    bs = BalancedSoftmaxLoss(COUNTS, LossConfig(name="balanced_softmax"))
    la = LogitAdjustedLoss(COUNTS, LossConfig(name="logit_adjusted", tau=1.0))
    shift = bs.log_counts - la.offsets
    assert torch.allclose(shift, torch.full_like(shift, math.log(sum(COUNTS))), rtol=0, atol=1e-12)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 3, (64,), generator=gen)
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    la_value, bs_value = la(b, targets), bs(a, targets)
    la_value.backward()
    bs_value.backward()
    assert float(bs_value.detach()) == pytest.approx(float(la_value.detach()), rel=1e-12)
    assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-12)
    # At τ ≠ 1 they differ: the equality above is not a tautology of the test.
    la2 = LogitAdjustedLoss(COUNTS, LossConfig(name="logit_adjusted", tau=2.0))
    assert float(la2(logits, targets)) != pytest.approx(float(bs(logits, targets)), rel=1e-3)


def test_posthoc_adjustment_by_hand():
    total = sum(COUNTS)
    logits = torch.tensor([[1.0, 0.8, 0.7]])
    adjusted = posthoc_adjust(logits, log_prior(COUNTS), tau=1.0)[0].tolist()
    expected = [v - math.log(n / total) for v, n in zip([1.0, 0.8, 0.7], COUNTS)]
    assert adjusted == pytest.approx(expected, rel=1e-6)
    assert int(logits.argmax()) == 0 and max(range(3), key=lambda i: expected[i]) == 2  # the tail wins


def test_losses_accept_low_precision_logits():
    # Under autocast the logits arrive in bf16; no loss may assume float32 or CUDA tensors.
    logits = torch.tensor(LOGITS, dtype=torch.bfloat16)
    for name in ("ce", "focal", "ldam", "balanced_softmax", "logit_adjusted"):
        value = _loss(name)(logits, torch.tensor(TARGETS))
        assert torch.isfinite(value), name


# --------------------------------------------------------------------------------------------------
# The global batch: the same loss and gradients at any world size
# --------------------------------------------------------------------------------------------------

SPLIT_COUNTS = [300, 120, 40, 9, 2]
WEIGHTINGS = {"plain": {}, "class_balanced": {"reweight": "class_balanced"}, "drw": {"drw_epoch": 1}}
LOSS_KW = {"ce": {}, "focal": {"focal_gamma": 1.0}, "ldam": {}, "balanced_softmax": {}, "logit_adjusted": {"tau": 1.0}}


def _ddp_step(name: str, weighting: str, world_size: int, features, targets, *, per_rank_mean: bool = False):
    """What DDP computes from one global batch at ``world_size`` ranks: rank r holds positions r::W, its
    loss's gradients are averaged over the ranks (DDP's all-reduce / W). Returns (the ranks' mean loss,
    the averaged gradients of a linear classifier)."""
    cfg = LossConfig(name=name, **LOSS_KW[name], **WEIGHTINGS[weighting])
    criterion = build_loss(cfg, SPLIT_COUNTS, world_size)
    criterion.set_epoch(1)  # DRW's weights are on
    layer = torch.nn.Linear(features.shape[1], len(SPLIT_COUNTS))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(7)
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen))
    losses, grads = [], []
    for rank in range(world_size):
        x, y = features[rank::world_size], targets[rank::world_size]
        logits = layer(x)
        if per_rank_mean:  # the per-rank normalisation of before: each rank's own weighted mean
            loss = build_loss(cfg, SPLIT_COUNTS, 1)
            loss.set_epoch(1)
            value = loss(logits, y)
        else:
            value = criterion(logits, y, targets)
        losses.append(value.detach())
        grads.append(torch.autograd.grad(value, list(layer.parameters())))
    mean_grads = [sum(g[i] for g in grads) / world_size for i in range(2)]
    return sum(losses) / world_size, mean_grads


@pytest.mark.parametrize("weighting", sorted(WEIGHTINGS))
@pytest.mark.parametrize("name", sorted(LOSS_KW))
def test_loss_and_gradients_of_a_global_batch_are_the_same_at_world_sizes_1_2_4(name, weighting):
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(37, 6, generator=gen)  # 37: shares of 19/18 and 10/9/9/9 images
    targets = torch.tensor([0, 0, 1, 0, 2, 3, 4, 0, 1, 1] * 3 + [4, 3, 2, 0, 0, 1, 4])
    loss1, grads1 = _ddp_step(name, weighting, 1, features, targets)
    for world in (2, 4):
        loss_w, grads_w = _ddp_step(name, weighting, world, features, targets)
        torch.testing.assert_close(loss_w, loss1, rtol=1e-6, atol=1e-6)
        for a, b in zip(grads_w, grads1):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    if weighting != "plain" and name != "focal":
        # Not vacuous: each rank's own weighted mean (the normalisation this replaced) is another gradient.
        _, per_rank = _ddp_step(name, weighting, 4, features, targets, per_rank_mean=True)
        assert (per_rank[0] - grads1[0]).abs().max() > 1e-3


@pytest.mark.parametrize("weighting", sorted(WEIGHTINGS))
@pytest.mark.parametrize("name", sorted(LOSS_KW))
def test_one_rank_is_bit_for_bit_the_batch_mean_loss(name, weighting):
    """World size 1 keeps the exact arithmetic of the batch-mean losses: F.cross_entropy(weight=w) with
    its own weighted mean (weight=None before DRW), focal's .mean() — written out here as they were."""
    cfg = LossConfig(name=name, **LOSS_KW[name], **WEIGHTINGS[weighting])
    loss = build_loss(cfg, SPLIT_COUNTS)
    loss.set_epoch(1)
    weighted = weighting != "plain"
    w = class_balanced_weights(SPLIT_COUNTS, cfg.cb_beta).float() if weighted else None
    gen = torch.Generator().manual_seed(11)
    for batch in (128, 118, 1):
        logits = (3 * torch.randn(batch, 5, generator=gen)).requires_grad_()
        targets = torch.randint(0, 5, (batch,), generator=gen)
        if name == "focal":
            ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            value = (1.0 - torch.exp(-ce)).pow(1.0) * ce
            expected = (value * w[targets] if weighted else value).mean()
        else:
            shifted = {"ce": lambda z: z, "balanced_softmax": lambda z: z + loss.log_counts.float(),
                       "logit_adjusted": lambda z: z + loss.offsets.float(),
                       "ldam": lambda z: 30.0 * torch.where(torch.nn.functional.one_hot(targets, 5).bool(),
                                                             z - loss.margins.float()[None, :], z)}[name](logits)
            expected = torch.nn.functional.cross_entropy(shifted, targets, weight=w)
        (want,) = torch.autograd.grad(expected, logits)
        (got,) = torch.autograd.grad(loss(logits, targets), logits)
        assert torch.equal(got, want), (name, weighting, batch)
