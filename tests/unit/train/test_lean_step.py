"""The lean step (issue 21): what it changed is checked against what it replaced, on the CPU.

* Under bf16, the one copy of the weights in the compute dtype (hpc_train/train/loop/lean.py) gives bit for bit
  the weights of plain autocast, which casts every weight in every pass: eager, and through the fake capture,
  in channels_last. (The bf16 numerics *did* change once, on purpose: the classifier and the loss run in float32
  in training as in evaluation — the reference loop below runs the same model class, so it has that too.)
* SAM with the copy is SAM under plain autocast, bit for bit: the perturbed weights reach the copy.
* Images normalised once at upload, in float32 or bf16 and NCHW or NHWC, are bit for bit the per-batch
  normalisation of the uint8 crops that it replaced (and bf16 is autocast's rounding of those).
* The fp32 formulation (the BatchNorm counters advanced together included) is checked bit for bit against main's
  loop in test_captured_step.py; the op count of the step in tests/bench/test_op_count.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpc_train.train.data import datasets  # noqa: E402
from hpc_train.train.data.pipeline import DeviceImages  # noqa: E402
from hpc_train.train.loop import graphs  # noqa: E402

from .helpers import deep_update, make_spec  # noqa: E402
from .test_captured_step import RECIPE, FakeGraphs, _different, _final_weights, _main_loop, _trainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_intraop_thread")  # tests/conftest.py says why

BF16 = deep_update(RECIPE, amp="bf16", channels_last=True, epochs=3, loss={"name": "ldam", "drw_epoch": 2},
                   schedule={"milestones": [1]})


def test_the_bf16_weight_copy_is_autocast_bit_for_bit(tmp_path, monkeypatch):
    spec = make_spec(BF16)
    reference = _main_loop(spec)  # plain autocast: every weight cast in every pass, the images in float32
    trainer = _trainer(spec, tmp_path / "eager")
    convolutions = sum(isinstance(m, torch.nn.Conv2d) for m in trainer.model.modules())
    assert trainer.step.weights is not None and len(trainer.step.weights) == convolutions
    assert trainer.feed.train_images().windows.dtype == torch.bfloat16  # stored as the first convolution casts
    test_images, _ = trainer.feed.eval_tensors("test")  # the test split too, once, as a view of the stored split
    stored = trainer.feed._device_split("test").images
    assert test_images.dtype == torch.bfloat16 and test_images.data_ptr() == stored.data_ptr()
    trainer.fit()
    assert not _different(_final_weights(tmp_path / "eager"), reference)
    monkeypatch.setattr(graphs, "BACKEND", FakeGraphs())
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    captured = _trainer(spec, tmp_path / "graphs")
    captured.fit()
    assert captured.runner.replays["full"] > 0 and captured.runner.failed is None
    assert not _different(_final_weights(tmp_path / "graphs"), reference)
    # Not vacuous: bf16 is not float32 (the reference loop without autocast ends elsewhere).
    assert _different(_main_loop(make_spec(deep_update(BF16, amp="off"))), reference)


def test_sam_on_the_weight_copy_is_sam_under_autocast(tmp_path):
    sam = deep_update(BF16, epochs=2, loss={"name": "ldam", "drw_epoch": 1},
                      optim={**RECIPE["optim"], "sam_rho": 0.5})
    runs = {}
    for copy in (True, False):
        trainer = _trainer(make_spec(deep_update(sam, amp_weight_copy=copy)), tmp_path / str(copy))
        assert (trainer.step.weights is not None) == copy and trainer.step.sam is not None
        trainer.fit()
        runs[copy] = _final_weights(tmp_path / str(copy))
    assert not _different(runs[True], runs[False])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_images_normalised_once_are_the_per_batch_normalisation(dtype):
    data = datasets.load(make_spec(RECIPE).train.data)
    padding, mean, std = 1, torch.tensor(data.mean).view(1, -1, 1, 1), torch.tensor(data.std).view(1, -1, 1, 1)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(data.train), (40,), generator=gen)
    for channels_last in (False, True):
        images = DeviceImages(data.train, torch.device("cpu"), mean=data.mean, std=data.std, crop_padding=padding,
                              flip=True, channels_last=channels_last, dtype=dtype)
        coords = images.draw(len(idx), gen)
        x, y = images.apply(idx, coords)
        # What the step did before: crop and flip the uint8 images, then normalise the batch
        raw = torch.nn.functional.pad(torch.from_numpy(data.train.images[idx.numpy()]), (padding,) * 4)
        crops = torch.stack([img[:, top:top + 8, left:left + 8] for img, top, left in
                             zip(raw, coords[:, 1], torch.where(coords[:, 0].bool(), 2 * padding - coords[:, 2],
                                                                coords[:, 2]))])
        crops = torch.where(coords[:, 0].bool()[:, None, None, None], crops.flip(3), crops)
        expected = crops.float().div_(255.0).sub_(mean).div_(std).to(dtype)
        assert x.dtype == dtype and torch.equal(x, expected) and torch.equal(y, images.labels[idx])
        assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def test_images_are_stored_in_the_amp_dtype_only_where_nothing_computes_with_them_first():
    from hpc_train.train.loop.engine import stored_dtype

    plain, mixed = make_spec(BF16).train, make_spec(deep_update(BF16, mixup_alpha=0.2)).train
    plugin = make_spec(deep_update(BF16, model={"name": "tests.unit.train.plugin_model:TinyNet"})).train
    assert stored_dtype(plain, torch.bfloat16) == torch.bfloat16  # the first convolution casts to it anyway
    assert stored_dtype(plain, None) == torch.float32
    # Mixup mixes the stored images before that cast: bf16 would round them three times (a mix of bf16 values).
    assert stored_dtype(mixed, torch.bfloat16) == torch.float32
    assert stored_dtype(plugin, torch.bfloat16) == torch.float32  # a plug-in's first operation is unknown


def test_the_classifier_runs_in_float32_under_amp_as_in_evaluation():
    from hpc_train.train.model.models import init_model

    spec = make_spec(BF16)
    model = init_model(spec.train, datasets.load(spec.train.data))
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, features = model(x), model.backbone(x)
    assert features.dtype == torch.bfloat16 and logits.dtype == torch.float32
    assert torch.equal(logits, model.classifier(features.float()))  # what evaluation's head computes


@pytest.mark.parametrize("mixup_alpha", [0.0, 0.4], ids=["plain", "mixup"])
def test_an_epoch_shorter_than_one_batch_is_planned(mixup_alpha):
    """Fewer images than a global batch (a tiny data set, a large batch): no full row, one short last one."""
    from hpc_train.train.data.plan import host_tables

    labels = torch.arange(5) % 3
    draw = lambda step, size: torch.ones(size, 3, dtype=torch.int64)  # noqa: E731
    plan = host_tables(torch.tensor([4, 0, 3, 1, 2]), labels, draw, augmented=True, batch_size=8, rank=0,
                       world_size=1, mixup_alpha=mixup_alpha)
    assert (plan.steps, plan.full_steps, plan.tables["full"].shape[0]) == (1, 0, 0)
    batch = plan.last_layout.split(plan.tables["last"])
    assert batch.idx.tolist() == [4, 0, 3, 1, 2] and batch.y.tolist() == labels[[4, 0, 3, 1, 2]].tolist()
    assert [c.tolist() for c in batch.coords] == [[1] * 5] * 3 and (batch.mix is not None) == bool(mixup_alpha)
