"""Each reference of the benchmarks computes the same thing as ours, from the same seed and data order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from benchmarks import ours, reference  # noqa: E402
from benchmarks.common import CIFAR_MEAN, CIFAR_STD, cifar_shaped_lt  # noqa: E402
from hpc_train.train.data.pipeline import DeviceImages  # noqa: E402
from hpc_train.train.data.samplers import GlobalSampler  # noqa: E402

from .replay import ReplayDataset, epoch_params  # noqa: E402

PAD = 4


pytestmark = pytest.mark.usefixtures("one_intraop_thread")  # tests/conftest.py says why


def small_data():
    # IF 10 keeps every class non-empty at this size: 40 31 23 18 14 11 8 6 5 4 = 160 images
    return cifar_shaped_lt(40, imbalance_factor=10, test_per_class=8)


@pytest.mark.parametrize("channels_last", [False, True])
def test_pipeline_reference_gives_the_same_pixels(channels_last):
    """torchvision's per-sample RandomCrop(32, padding=4) + flip + ToTensor + Normalize, with our crop
    offsets and flips, is bit for bit our batched gather / flip / normalise."""
    data = small_data()
    ours_images = DeviceImages(data.train, torch.device("cpu"), mean=CIFAR_MEAN, std=CIFAR_STD, crop_padding=PAD,
                               flip=True, channels_last=channels_last)
    idx = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(1))[:48]
    gen = torch.Generator().manual_seed(1234)
    x_ours, y_ours = ours_images.augmented(idx, gen)
    offsets, flips = (lambda g: (torch.randint(0, 2 * PAD + 1, (48, 2), generator=g),
                                 torch.rand(48, generator=g) < 0.5))(torch.Generator().manual_seed(1234))
    params = {int(i): (int(o[0]), int(o[1]), bool(f)) for i, o, f in zip(idx, offsets, flips)}
    ref = ReplayDataset(data.train.images, data.train.labels, reference.train_transform(), params)
    x_ref = torch.stack([ref[int(i)][0] for i in idx])
    y_ref = torch.tensor([ref[int(i)][1] for i in idx])
    assert flips.any() and not flips.all() and len({tuple(o) for o in offsets.tolist()}) > 5  # a real mix
    assert torch.equal(x_ours, x_ref)
    assert torch.equal(y_ours, y_ref)
    assert x_ours.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_reference_transforms_are_torchvisions():
    names = [type(t).__name__ for t in reference.train_transform().transforms]
    assert names == ["RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    crop = reference.train_transform().transforms[0]
    assert crop.size == (32, 32) and crop.padding == 4 and crop.fill == 0 and crop.padding_mode == "constant"


def _our_losses(spec, data, tmp_path, epochs: int = 1) -> tuple[list[float], object]:
    trainer = ours.build_trainer(spec, data, tmp_path / "run")
    losses: list[float] = []
    trainer.criterion.register_forward_hook(lambda _m, _i, out: losses.append(out.item()))
    for _ in range(epochs):
        ours.train_one_epoch(trainer)
    return losses, trainer


def _reference_losses(spec, data, trainer, epochs: int = 1, workers: int = 2) -> tuple[list[float], object]:
    from hpc_train.train.model.losses import build_loss
    from hpc_train.train.model.models import init_model

    t = spec.train
    model = init_model(t, data)  # the same seeded initialisation as the trainer's
    criterion = build_loss(t.loss, [int(c) for c in data.train_counts])
    optimizer = torch.optim.SGD(model.parameters(), t.optim.lr, momentum=t.optim.momentum,
                                weight_decay=t.optim.weight_decay)
    sampler = GlobalSampler(data.train.labels, data.num_classes, name=trainer.sampler.name, seed=trainer.sampler.seed)
    losses: list[float] = []
    import io

    for epoch in range(epochs):
        batches, params = epoch_params(sampler, epoch, t.batch_size, PAD, t.seed)
        dataset = ReplayDataset(data.train.images, data.train.labels, reference.train_transform(), params)
        loader = reference.train_loader(dataset, workers=workers, batch_sampler=batches)
        reference.adjust_learning_rate(optimizer, epoch, t.optim.lr)
        criterion.set_epoch(epoch)
        reference.train_epoch(loader, model, criterion, optimizer, epoch, device=torch.device("cpu"), log=io.StringIO(),
                              on_loss=losses.append)
    return losses, model


def test_reference_loop_matches_our_trainer_step_for_step(tmp_path):
    """The LDAM-DRW recipe (ResNet-32, cosine classifier, LDAM loss, SGD with warm-up), batch 32: the
    reference loop over a torchvision DataLoader with 2 workers, fed our data order and augmentations,
    gives our trainer's losses at every step of two epochs (fp32, NCHW: identical)."""
    data = small_data()
    spec = ours.recipe_spec(device="cpu", batch_size=32, num_threads=1)
    mine, trainer = _our_losses(spec, data, tmp_path, epochs=2)
    theirs, model = _reference_losses(spec, data, trainer, epochs=2)
    assert len(mine) == len(theirs) == 2 * 5
    assert theirs == pytest.approx(mine, rel=1e-6, abs=1e-6)
    assert len(set(round(v, 4) for v in mine)) > 5  # the losses move: the comparison is not vacuous
    for (name, a), b in zip(trainer.model.state_dict().items(), model.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


def test_channels_last_trainer_matches_the_reference_loop(tmp_path):
    """What the CPU benchmark runs as ours (``channels_last: true``) against the NCHW reference: the
    same losses up to the float rounding of the other convolution layout — about 1e-7 at the first
    step, growing roughly tenfold per step (BatchNorm at batch 32, LDAM's scale of 30), so the first
    steps are held tight and the rest loosely."""
    data = small_data()
    spec = ours.recipe_spec(device="cpu", batch_size=32, num_threads=1, channels_last=True)
    mine, trainer = _our_losses(spec, data, tmp_path)
    theirs, _ = _reference_losses(spec, data, trainer, workers=0)
    assert len(mine) == len(theirs) == 5
    assert theirs[:2] == pytest.approx(mine[:2], rel=1e-5)
    assert theirs == pytest.approx(mine, rel=1e-2)


def test_reference_validate_matches_our_exact_evaluation(tmp_path):
    """cifar_train.py's validate() per-class accuracy (confusion-matrix diagonal) equals our evaluation's
    per-class [correct, count] on the same weights."""
    data = small_data()
    spec = ours.recipe_spec(device="cpu", batch_size=32, num_threads=1)
    _, trainer = _our_losses(spec, data, tmp_path)  # trained weights: predictions are not all one class
    correct, count = trainer.evaluate("test", trainer.heads())["plain"]
    mine = [c / n for c, n in zip(correct, count)]
    test_set = reference.CifarLikeDataset(data.test.images, data.test.labels, reference.eval_transform())
    loader = torch.utils.data.DataLoader(test_set, batch_size=100, shuffle=False, num_workers=0)
    theirs = reference.validate(loader, trainer.model, device=torch.device("cpu"))
    assert theirs == mine
    assert 0 < sum(correct) < sum(count)


def test_reference_learning_rate_is_our_schedule():
    """cifar_train.py's adjust_learning_rate and the recipe's multistep schedule agree at every epoch."""
    from hpc_train.train.loop.schedule import LrSchedule

    spec = ours.recipe_spec(device="cpu")
    t = spec.train
    schedule = LrSchedule(t.schedule, t.optim.lr, t.epochs)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    for epoch in range(t.epochs):
        assert reference.adjust_learning_rate(opt, epoch, t.optim.lr) == pytest.approx(schedule.lr(epoch), rel=1e-12)


def test_scaling_model_numbers():
    from benchmarks import scaling

    assert scaling.all_reduce_s(1e9, 1, 25) == 0.0  # one node: NVLink, taken as free
    # 2 nodes x 8 = 16 ranks: 2 * 15/16 * 1 GB * 8 bit / 100 Gb/s = 0.15 s
    assert scaling.all_reduce_s(1e9, 2, 100) == pytest.approx(0.15)
    assert scaling.efficiency(3.0, 1.0, overlap=False) == pytest.approx(0.75)
    assert scaling.efficiency(3.0, 1.0, overlap=True) == pytest.approx(1.0)  # hidden behind the 2 s backward
    counts = scaling.parameter_counts()
    assert counts == {"resnet32": 464_154, "resnet50": 25_557_032}
