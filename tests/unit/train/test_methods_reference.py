"""The methods against the formulas of their reference repositories, each transcribed here from that code (file
and line cited; the transcriptions are ours, written from reading it) and compared on random inputs:

* Cui et al.'s class-balanced losses (richardaecn/class-balanced-loss): sigmoid, focal (``sigmoid_focal``) and
  the softmax loss divided by the batch size (``normalise: batch_size``), with the effective-number weights.
* MiSLAS's label-aware smoothing, mixup and expected calibration error (dvlab-research/MiSLAS).
* SAM as Saddle-LongTail trains LDAM-DRW with it (val-iisc/Saddle-LongTail) and ImbSAM (cool-xuan/Imbalanced_SAM).
* Weight balancing's MaxNorm (ShadeAlsha/LTR-weight-balancing), in its own right and in stage 2 of a run.
* cRT's fresh classifier and the stage-1 classifiers: PyTorch's default ``nn.Linear`` where the references create
  one (facebookresearch/classifier-balancing), Kaiming where LDAM-DRW's network initialises it so.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from hpc_train.config import LossConfig, OptimConfig, TrainConfig  # noqa: E402
from hpc_train.train.loop.sam import SharpnessAware  # noqa: E402
from hpc_train.train.model.losses import build_loss  # noqa: E402
from hpc_train.train.model.two_stage import MaxNorm  # noqa: E402

COUNTS = [500, 210, 90, 40, 17, 7, 3]
C = len(COUNTS)


def _batch(seed: int, n: int = 64, scale: float = 3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, C, generator=gen, dtype=torch.float64)
    return logits, torch.randint(0, C, (n,), generator=gen)


# --------------------------------------------------------------------------------------------------
# Cui et al. 2019: richardaecn/class-balanced-loss, src/cifar_main.py (HEAD 1d78572)
# --------------------------------------------------------------------------------------------------


def _cui_weights(beta: float) -> torch.Tensor:
    """l.425-430: effective_num = 1 - beta^n; weights = (1 - beta) / effective_num, normalised to sum to C."""
    effective_num = 1.0 - np.power(beta, COUNTS)
    weights = (1.0 - beta) / np.array(effective_num)
    return torch.tensor(weights / np.sum(weights) * C)


def _cui_tower_loss(label, logits, weights, loss_type: str, gamma: float):
    """l.323-342 (``_tower_fn``) with ``focal_loss`` l.226-266, TensorFlow ops written in torch:
    ``sigmoid_cross_entropy_with_logits`` is BCE with logits; ``tf.losses.softmax_cross_entropy`` with
    per-example weights reduces by SUM_BY_NONZERO_WEIGHTS (its default)."""
    one_hot_labels = F.one_hot(label, C).to(logits.dtype)
    w = weights[None, :].repeat(one_hot_labels.shape[0], 1) * one_hot_labels
    w = w.sum(1)[:, None].repeat(1, C)
    if loss_type == "softmax":
        per_example = w.mean(1)
        ce = -(one_hot_labels * F.log_softmax(logits, 1)).sum(1)
        return (per_example * ce).sum() / (per_example != 0).sum()
    bce = F.binary_cross_entropy_with_logits(logits, one_hot_labels, reduction="none")
    if loss_type == "sigmoid":
        return (w * bce).sum() / one_hot_labels.sum()
    modulator = 1.0 if gamma == 0.0 else torch.exp(
        -gamma * one_hot_labels * logits - gamma * torch.log1p(torch.exp(-1.0 * logits)))
    return (w * (modulator * bce)).sum() / one_hot_labels.sum()


@pytest.mark.parametrize("loss_type, gamma", [("focal", 1.0), ("focal", 2.0), ("sigmoid", 0.0), ("softmax", 0.0)])
def test_cui_class_balanced_losses(loss_type, gamma):
    beta = 0.9999
    for seed in range(5):
        logits, target = _batch(seed)
        expected = _cui_tower_loss(target, logits, _cui_weights(beta), loss_type, gamma)
        if loss_type == "softmax":
            cfg = LossConfig(name="ce", reweight="class_balanced", cb_beta=beta, normalise="batch_size")
        else:
            cfg = LossConfig(name="sigmoid_focal", reweight="class_balanced", cb_beta=beta, focal_gamma=gamma)
        got = build_loss(cfg, COUNTS)(logits, target)
        assert float(got) == pytest.approx(float(expected), rel=1e-12), (loss_type, seed)
    # Not vacuous: the project's default (Σw, LDAM-DRW's weighted CE) is another number for the softmax loss.
    default = build_loss(LossConfig(name="ce", reweight="class_balanced", cb_beta=beta), COUNTS)(logits, target)
    assert float(default) != pytest.approx(float(_cui_tower_loss(target, logits, _cui_weights(beta), "softmax", 0)),
                                           rel=1e-3)


def test_sigmoid_focal_starts_each_class_at_one_over_c():
    # src/model_base.py l.192-197: the sigmoid and focal models' last layer starts with bias -log(C - 1).
    from hpc_train.train.data import datasets
    from hpc_train.train.model.models import init_model

    cfg = TrainConfig(loss=LossConfig(name="sigmoid_focal"))
    model = init_model(cfg, datasets.load(cfg.data))
    assert torch.equal(model.classifier.bias, torch.full((10,), -math.log(9)))


def test_a_re_created_stage_two_classifier_for_sigmoid_focal_starts_at_one_over_c(tmp_path):
    # The same bias init for a classifier cRT re-creates when stage 2's loss is the sigmoid focal loss.
    from hpc_train.rank.dist import DistEnv
    from hpc_train.train.data import datasets
    from hpc_train.train.loop.context import RankContext
    from hpc_train.train.loop.engine import Trainer

    from .helpers import DIGITS_QUICK, deep_update, make_spec

    spec = make_spec(deep_update(DIGITS_QUICK, epochs=1, two_stage={"crt_epochs": 1, "crt_reinit": True,
                                                                      "crt_loss": {"name": "sigmoid_focal"}}))
    ctx = RankContext(env=DistEnv.from_environ(), device=torch.device("cpu"), rank=0, world_size=1, distributed=False)
    trainer = Trainer(spec, ctx, datasets.load(spec.train.data), tmp_path / "run")
    trainer._setup_phase("crt", starting=True)
    assert torch.equal(trainer.model.classifier.bias, torch.full((10,), -math.log(9)))


# --------------------------------------------------------------------------------------------------
# MiSLAS: dvlab-research/MiSLAS (HEAD 0fc381e)
# --------------------------------------------------------------------------------------------------


def _mislas_label_aware_smoothing(cls_num_list, smooth_head, smooth_tail, x, target):
    """methods.py l.31-64, ``LabelAwareSmoothing`` with shape 'concave'."""
    n_1, n_k = max(cls_num_list), min(cls_num_list)
    smooth = smooth_tail + (smooth_head - smooth_tail) * np.sin(
        (np.array(cls_num_list) - n_k) * np.pi / (2 * (n_1 - n_k)))
    smooth = torch.from_numpy(smooth).float()
    smoothing = smooth[target]
    confidence = 1.0 - smoothing
    logprobs = F.log_softmax(x, dim=-1)
    nll_loss = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
    smooth_loss = -logprobs.mean(dim=-1)
    return (confidence * nll_loss + smoothing * smooth_loss).mean()


@pytest.mark.parametrize("head, tail", [(0.4, 0.1), (0.3, 0.0)])  # MiSLAS's CIFAR-100-LT and CIFAR-10-LT configs
def test_mislas_label_aware_smoothing(head, tail):
    loss = build_loss(LossConfig(name="label_aware_smoothing", smooth_head=head, smooth_tail=tail), COUNTS)
    for seed in range(5):
        logits, target = _batch(seed)
        logits = logits.float()
        expected = _mislas_label_aware_smoothing(COUNTS, head, tail, logits, target)
        assert float(loss(logits, target)) == pytest.approx(float(expected), rel=1e-6)
    plain = build_loss(LossConfig(name="ce"), COUNTS)(logits, target)
    assert float(plain) != pytest.approx(float(expected), rel=1e-3)  # not vacuous: smoothing matters


def _mislas_stage2_lr(epoch: int, num_epochs: int, lr: float, lr_factor: float) -> float:
    """train_stage2.py l.452-460 (``adjust_learning_rate``, called at the start of each epoch, l.250): the
    classifier's group (idx 0) at lr_factor x the cosine for epoch e."""
    lr_min, lr_max = 0, lr
    cosine = lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(epoch / num_epochs * 3.1415926535))
    return lr_factor * cosine


@pytest.mark.parametrize("recipe, lr_factor", [("cifar10_lt_mislas", 0.5), ("cifar100_lt_mislas", 0.2)])
def test_mislas_stage_two_cosine_is_its_adjust_learning_rate(recipe, lr_factor):
    # config/cifar{10,100}/*_stage2_mislas.yaml: lr 0.1, lr_factor 0.5 (C10) / 0.2 (C100), 10 epochs.
    from hpc_train.config import ScheduleConfig, resolve_job
    from hpc_train.train.loop.schedule import LrSchedule

    from .helpers import REPO

    spec, _ = resolve_job(REPO / "jobs" / f"{recipe}.yaml", sets=[])
    two = spec.train.two_stage
    schedule = LrSchedule(ScheduleConfig(name="cosine", update=two.crt_lr_update), two.crt_lr, two.crt_epochs)
    for epoch in range(two.crt_epochs):
        want = _mislas_stage2_lr(epoch, 10, 0.1, lr_factor)
        for step in (0, 7):
            assert schedule.lr(epoch, step, 20) == pytest.approx(want, rel=1e-9, abs=1e-15), (epoch, step)


def _mislas_calibration(true_labels, pred_labels, confidences, num_bins=15):
    """utils/metric.py l.21-79, ``calibration`` (its ``np.float``/``np.int`` spelled as today's numpy needs)."""
    bins = np.linspace(0.0, 1.0, num_bins + 1)
    indices = np.digitize(confidences, bins, right=True)
    bin_accuracies = np.zeros(num_bins, dtype=np.float64)
    bin_confidences = np.zeros(num_bins, dtype=np.float64)
    bin_counts = np.zeros(num_bins, dtype=np.int64)
    for b in range(num_bins):
        selected = np.where(indices == b + 1)[0]
        if len(selected) > 0:
            bin_accuracies[b] = np.mean(true_labels[selected] == pred_labels[selected])
            bin_confidences[b] = np.mean(confidences[selected])
            bin_counts[b] = len(selected)
    gaps = np.abs(bin_accuracies - bin_confidences)
    return np.sum(gaps * bin_counts) / np.sum(bin_counts)


def test_expected_calibration_error_is_mislas_with_15_bins():
    from hpc_train.train.observe.evaluation import calibration_bins
    from hpc_train.train.observe.metrics import expected_calibration_error

    edges = torch.from_numpy(np.linspace(0.0, 1.0, 16))
    for seed, scale in ((0, 1.0), (1, 3.0), (2, 8.0)):
        logits, target = _batch(seed, n=2000, scale=scale)
        logits = logits.float()
        # train_stage2.py l.419-423: the top softmax probability and its class.
        confidence, pred = torch.max(torch.softmax(logits, dim=1), dim=1)
        expected = _mislas_calibration(target.numpy(), pred.numpy(), confidence.numpy())
        # Ours in two shards summed, as ranks sum their bins.
        parts = [calibration_bins(logits[i::2], (logits[i::2].argmax(1) == target[i::2]), edges) for i in range(2)]
        count, correct, summed = (sum(p[k] for p in parts) for k in range(3))
        got = expected_calibration_error(count.tolist(), correct.tolist(), summed.tolist())
        assert got == pytest.approx(expected, rel=1e-6), seed  # MiSLAS averages its float32 confidences in float32
        assert expected > 0.01  # not vacuous


def _mislas_mixup_loop(spec, epochs: int) -> dict:
    """Training with MiSLAS's mixup (methods.py l.8-28: mixed_x = lam·x + (1 - lam)·x[index]; loss lam·
    criterion(pred, y_a) + (1 - lam)·criterion(pred, y_b); train_stage1.py l.310-320), written out with the plain
    batch-mean cross-entropy, and λ and the permutation taken from hpc-train's per-global-batch draws."""
    from hpc_train.train.data import datasets, mixup
    from hpc_train.train.data.pipeline import DeviceImages, default_crop_padding, default_flip
    from hpc_train.train.data.samplers import GlobalSampler, derive_seed
    from hpc_train.train.loop.schedule import LrSchedule
    from hpc_train.train.model.models import init_model

    t = spec.train
    data = datasets.load(t.data)
    model = init_model(t, data)
    images = DeviceImages(data.train, torch.device("cpu"), mean=data.mean, std=data.std,
                          crop_padding=default_crop_padding(t, data), flip=default_flip(t, data), channels_last=False)
    sampler = GlobalSampler(data.train.labels, data.num_classes, name="instance", seed=derive_seed(t.seed, "main"))
    optimizer = torch.optim.SGD(model.parameters(), lr=t.optim.lr, momentum=t.optim.momentum,
                                weight_decay=t.optim.weight_decay)
    schedule = LrSchedule(t.schedule, t.optim.lr, t.epochs)
    model.train()
    for epoch in range(epochs):
        sequence = sampler.global_sequence(epoch)
        steps = -(-len(sequence) // t.batch_size)
        for step in range(steps):
            idx = sequence[step * t.batch_size:(step + 1) * t.batch_size]
            gen = torch.Generator().manual_seed(derive_seed("augment", t.seed, epoch, step, 0))
            x, y = images.apply(idx, images.draw(len(idx), gen))
            lam, index = mixup.draw(t.mixup_alpha, t.seed, epoch, step, len(idx))
            mixed_x = lam * x + (1 - lam) * x[index, :]
            y_a, y_b = y, y[index]
            pred = model(mixed_x)
            loss = lam * F.cross_entropy(pred, y_a) + (1 - lam) * F.cross_entropy(pred, y_b)
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr(epoch, step, steps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.state_dict()


def test_mixup_is_mislas_mixup_of_each_global_batch(tmp_path):
    from hpc_train.train import launch
    from hpc_train.train.state import checkpoint as ckpt

    from .helpers import DIGITS_QUICK, deep_update, make_spec

    spec = make_spec(deep_update(DIGITS_QUICK, epochs=2, mixup_alpha=1.0))
    assert launch.run(spec, run_dir=str(tmp_path / "run")).exit_code == 0
    trained = ckpt.load_latest(tmp_path / "run")[0]["model"]
    expected = _mislas_mixup_loop(spec, 2)
    keys = [k for k, v in expected.items() if v.is_floating_point()]
    flat = [torch.cat([d[k].double().flatten() for k in keys]) for d in (trained, expected)]
    # λ is a float32 tensor in the step (read on the device), a Python float in MiSLAS: rounding apart.
    assert float((flat[0] - flat[1]).norm() / flat[1].norm()) < 1e-6
    nearly_unmixed = _mislas_mixup_loop(make_spec(deep_update(DIGITS_QUICK, epochs=2, mixup_alpha=0.01)), 2)
    other = torch.cat([nearly_unmixed[k].double().flatten() for k in keys])
    assert float((other - flat[1]).norm() / flat[1].norm()) > 1e-2  # not vacuous: λ's distribution matters


# --------------------------------------------------------------------------------------------------
# SAM: val-iisc/Saddle-LongTail (HEAD 48328fb) and ImbSAM: cool-xuan/Imbalanced_SAM (HEAD c65f41e)
# --------------------------------------------------------------------------------------------------


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Tanh(), nn.Flatten(),
                         nn.Linear(8 * 16, C)).double()


def _inputs(step: int):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(24, 3, 4, 4, generator=gen, dtype=torch.float64)
    y = torch.tensor(([0, 1, 2, 3, 4, 5, 6] * 4)[:24])[torch.randperm(24, generator=gen)]
    return x, y


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=2e-4)


def _saddle_sam_step(model, optimizer, criterion, x, y, rho: float) -> None:
    """cifar_train_sam.py l.301-310 with sam.py l.14-37 and l.48-58 (``first_step``, ``second_step``,
    ``_grad_norm``; adaptive False): loss, backward, climb to w + rho·g/(‖g‖ + 1e-12), loss, backward, back to
    w, the base optimizer's step."""
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.norm(torch.stack([p.grad.norm(p=2) for p in params]), p=2)
    scale = rho / (grad_norm + 1e-12)
    old = {}
    with torch.no_grad():
        for p in params:
            old[p] = p.data.clone()
            p.add_(p.grad * scale.to(p))
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    with torch.no_grad():
        for p in params:
            p.data = old[p]
    optimizer.step()
    optimizer.zero_grad()


def test_sam_is_saddle_longtails_sam():
    weights = torch.tensor([0.2, 0.4, 0.6, 1.0, 1.3, 1.6, 1.9], dtype=torch.float64)  # DRW's weights are on
    reference, ours = _net(), _net()
    ref_opt, our_opt = _sgd(reference), _sgd(ours)
    criterion = build_loss(LossConfig(name="ce"), COUNTS)
    criterion.class_weights.copy_(weights)
    sam = SharpnessAware(list(ours.parameters()), rho=0.8)
    for step in range(4):
        x, y = _inputs(step)
        _saddle_sam_step(reference, ref_opt, lambda out, t: F.cross_entropy(out, t, weight=weights), x, y, rho=0.8)
        sam.step(lambda: criterion(ours(x), y), our_opt)
    for (name, a), b in zip(reference.state_dict().items(), ours.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), name  # BatchNorm moved twice per step in both
    plain = _net()
    opt = _sgd(plain)
    for step in range(4):
        x, y = _inputs(step)
        opt.zero_grad()
        F.cross_entropy(plain(x), y, weight=weights).backward()
        opt.step()
    assert not torch.allclose(plain[4].weight, ours[4].weight, atol=1e-4)  # not vacuous: ρ moves the result


def _imbsam_step(model, optimizer, x, y, tail_classes, rho: float) -> None:
    """utils/trainval.py l.128-143 (``forbackward``, optim_mode 'imbsam') with imbsam.py l.42-89 (``ImbSAM``):
    the head part's gradient kept, the tail part's (times 2) gives ε = rho·g/(‖g‖ + 1e-16), the tail part's
    gradient at w + ε (a second forward of every image, the tail's logits) plus the kept one steps from w."""
    loss = F.cross_entropy(model(x), y, reduction="none")
    tail_mask = torch.where((y[:, None] == tail_classes[None, :]).sum(1) == 1, True, False)
    head_loss = loss[~tail_mask].sum() / y.size(0)
    head_loss.backward(retain_graph=True)
    kept = {p: p.grad.clone() for p in model.parameters() if p.grad is not None}
    optimizer.zero_grad()
    tail_loss = loss[tail_mask].sum() / y.size(0) * 2
    tail_loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.norm(torch.stack([torch.norm(p.grad, p=2) for p in params]), p=2) + 1.e-16
    eps = {}
    with torch.no_grad():
        for p in params:
            eps[p] = p.grad.clone().mul_(rho / grad_norm)
            p.add_(eps[p])
    optimizer.zero_grad()
    logits = model(x)
    (F.cross_entropy(logits[tail_mask], y[tail_mask], reduction="none").sum() / y.size(0) * 2).backward()
    with torch.no_grad():
        for p in params:
            p.sub_(eps[p])
            p.grad.add_(kept[p])
    optimizer.step()
    optimizer.zero_grad()


def test_imbsam_is_imbalanced_sams_step():
    eta = 20  # scripts/train.py l.41 (--eta) and l.142: tail classes have fewer than eta training images
    tail_classes = torch.where(torch.tensor(COUNTS) < eta)[0]
    reference, ours = _net(), _net()
    ref_opt, our_opt = _sgd(reference), _sgd(ours)
    cfg = TrainConfig(optim=OptimConfig(sam_rho=0.05, sam_tail_below=eta))
    from hpc_train.train.loop.step import sharpness_aware

    sam = sharpness_aware(cfg, our_opt, COUNTS, torch.device("cpu"), None)
    assert sam.tail_classes.tolist() == [n < eta for n in COUNTS] and sam.tail_weight == 2.0
    # The boundary: a class with exactly eta images is a head class (l.142: counts < eta).
    at_eta = sharpness_aware(cfg, _sgd(_net()), [500, eta + 1, eta, eta - 1, 3], torch.device("cpu"), None)
    assert at_eta.tail_classes.tolist() == [False, False, False, True, True]
    criterion = build_loss(LossConfig(name="ce"), COUNTS)

    def terms():
        values, scale = criterion.terms(ours(x), y)
        return values, scale, y

    for step in range(4):
        x, y = _inputs(step)
        _imbsam_step(reference, ref_opt, x, y, tail_classes, rho=0.05)
        sam.imbalanced_step(terms, our_opt)
    for (name, a), b in zip(reference.state_dict().items(), ours.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), name
    plain_sam, opt = _net(), None
    opt = _sgd(plain_sam)
    everyone = SharpnessAware(list(plain_sam.parameters()), rho=0.05)
    for step in range(4):
        x, y = _inputs(step)
        everyone.step(lambda: criterion(plain_sam(x), y), opt)
    assert not torch.allclose(plain_sam[4].weight, ours[4].weight, atol=1e-4)  # ImbSAM is not SAM


# --------------------------------------------------------------------------------------------------
# Weight balancing: ShadeAlsha/LTR-weight-balancing (HEAD e89f292)
# --------------------------------------------------------------------------------------------------


def _wb_maxnorm(layer: nn.Linear, thresh: float, steps: list) -> list[torch.Tensor]:
    """utils/regularizers.py l.8-50 (``MaxNorm_via_PGD``, LpNorm 2, tau 1): the threshold set once from the
    layer's per-class norms (``setPerLayerThresh``, l.16-28), then ``PGD`` (l.30-50) after each change."""
    curparam = layer.weight.data
    norms = torch.linalg.norm(curparam.reshape((curparam.shape[0], -1)), ord=2, dim=1).detach().unsqueeze(-1)
    thresh_value = norms.min() + thresh * (norms.max() - norms.min())
    out = []
    for change in steps:
        layer.weight.data += change
        curparam = layer.weight.data
        norm = (torch.linalg.norm(curparam.reshape((curparam.shape[0], -1)), ord=2, dim=1) ** 1).detach().unsqueeze(-1)
        scaling = torch.ones_like(curparam)
        idx = (norm > thresh_value).squeeze()
        tmp = (thresh_value / (norm[idx].squeeze()) ** 1).unsqueeze(-1)
        scaling[idx] = torch.mul(scaling[idx], tmp)
        curparam[idx] = scaling[idx] * curparam[idx]
        out.append(curparam.clone())
    return out


def test_maxnorm_is_weight_balancings_projection():
    torch.manual_seed(0)
    layer = nn.Linear(16, C)
    with torch.no_grad():
        layer.weight.mul_(torch.linspace(0.5, 3.0, C)[:, None])  # norms from small (tail) to large (head)
    gen = torch.Generator().manual_seed(1)
    changes = [0.3 * torch.randn(C, 16, generator=gen) for _ in range(3)]
    expected = _wb_maxnorm(copy.deepcopy(layer), 0.1, changes)
    ours = copy.deepcopy(layer)
    cap = MaxNorm.start(ours, 0.1)
    for change, want in zip(changes, expected):
        with torch.no_grad():
            ours.weight += change
        cap.project(ours)
        assert torch.allclose(ours.weight, want, rtol=1e-6, atol=1e-7)
    assert (ours.weight.norm(dim=1) < layer.weight.norm(dim=1).max() * 0.5).all()  # not vacuous: it capped


def test_stage_two_with_maxnorm_weight_decay_and_its_own_loss(tmp_path):
    """Weight balancing's stage 2 in a run: the stage-1 classifier fine-tuned (not re-initialised) with its own
    loss and weight decay, the radius fixed from the stage-1 classifier and every class vector within it after
    each stage-2 epoch; the radius is in the checkpoint for a resume."""
    from hpc_train.train import launch
    from hpc_train.train.state import checkpoint as ckpt

    from .helpers import DIGITS_QUICK, deep_update, make_spec

    spec = make_spec(deep_update(DIGITS_QUICK, epochs=2, keep_checkpoints=10, two_stage={
        "crt_epochs": 2, "crt_lr": 0.05, "crt_reinit": False, "crt_max_norm": 0.1, "crt_weight_decay": 0.1,
        "crt_sampler": "instance", "crt_loss": {"name": "ce", "reweight": "class_balanced", "normalise": "batch_size"}}))
    assert launch.run(spec, run_dir=str(tmp_path / "run")).exit_code == 0
    states = {s["epoch"]: s for s in (torch.load(p, weights_only=True) for p in ckpt.list_checkpoints(tmp_path / "run"))}
    stage1 = states[2]["model"]["classifier.weight"]
    norms = stage1.norm(dim=1)
    radius = float(norms.min() + 0.1 * (norms.max() - norms.min()))
    assert states[4]["max_norm_radius"] == pytest.approx(radius, rel=1e-12)
    for epoch in (3, 4):
        assert (states[epoch]["model"]["classifier.weight"].norm(dim=1) <= radius * (1 + 1e-6)).all(), epoch
    assert torch.equal(states[4]["stage1"]["classifier"]["weight"], stage1)  # fine-tuned from it, not re-created
    assert states[4]["optimizer"]["param_groups"][0]["weight_decay"] == 0.1


# --------------------------------------------------------------------------------------------------
# Classifier initialisation: facebookresearch/classifier-balancing (HEAD f162ade), kaidic/LDAM-DRW
# --------------------------------------------------------------------------------------------------


def test_crt_re_creates_the_classifier_as_nn_linear_does(tmp_path):
    # classifier-balancing's cRT builds a new DotProduct_Classifier: nn.Linear(feat_dim, num_classes) with
    # PyTorch's default init (models/DotProductClassifier.py l.25, create_model l.31-33; config/ImageNet_LT/
    # cls_crt.yaml: stage1_weights false), std 1/sqrt(3d) — not Kaiming's sqrt(2/d), 2.4 times wider.
    from hpc_train.train.data import datasets
    from hpc_train.train.data.samplers import derive_seed
    from hpc_train.train.loop.context import RankContext
    from hpc_train.train.loop.engine import Trainer
    from hpc_train.rank.dist import DistEnv

    from .helpers import DIGITS_QUICK, deep_update, make_spec

    spec = make_spec(deep_update(DIGITS_QUICK, epochs=1, two_stage={"crt_epochs": 1}))
    ctx = RankContext(env=DistEnv.from_environ(), device=torch.device("cpu"), rank=0, world_size=1, distributed=False)
    trainer = Trainer(spec, ctx, datasets.load(spec.train.data), tmp_path / "run")
    trainer._setup_phase("crt", starting=True)
    torch.manual_seed(derive_seed("crt", spec.train.seed))
    reference = nn.Linear(trainer.model.feature_dim, 10)
    assert torch.equal(trainer.model.classifier.weight, reference.weight)
    assert torch.equal(trainer.model.classifier.bias, reference.bias)


def test_stage_one_classifiers_start_as_their_references_start_them():
    from hpc_train.config import ModelConfig
    from hpc_train.train.model.models import build_model

    torch.manual_seed(0)
    resnext = build_model(ModelConfig(name="resnext50_32x4d"), num_classes=1000, in_channels=3).classifier.weight
    # classifier-balancing's ImageNet-LT stage 1 (config/ImageNet_LT/feat_uniform.yaml: DotProductClassifier).
    assert float(resnext.detach().std()) == pytest.approx(1 / math.sqrt(3 * 2048), rel=0.02)
    # LDAM-DRW's resnet_cifar.py (_weights_init: kaiming_normal_ on every nn.Linear): sqrt(2 / 64).
    resnet32 = build_model(ModelConfig(name="resnet32"), num_classes=100, in_channels=3).classifier.weight
    assert float(resnet32.detach().std()) == pytest.approx(math.sqrt(2 / 64), rel=0.05)
