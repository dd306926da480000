"""On-disk data sets: list files (ImageNet-LT style) and ImageFolder trees, on images generated here."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from hpc_train.config import DataConfig  # noqa: E402
from hpc_train.train import launch  # noqa: E402
from hpc_train.train.__main__ import main  # noqa: E402
from hpc_train.train.data import datasets
from hpc_train.train.data.datasets import DataError  # noqa: E402
from hpc_train.train.data.pipeline import Feed  # noqa: E402

from .helpers import ldam_counts, make_spec  # noqa: E402

COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
TRAIN_PER_CLASS = [12, 6, 3]


def _write_image(path, colour, size=(20, 24)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


@pytest.fixture
def list_root(tmp_path):
    """root/{train,val,test}/c<k>/..., one solid colour per class, and the three list files."""
    root = tmp_path / "imagenet"
    entries = {"train": [], "val": [], "test": []}
    for split, per_class in (("train", TRAIN_PER_CLASS), ("val", [2, 2, 2]), ("test", [4, 4, 4])):
        for label, n in enumerate(per_class):
            for i in range(n):
                rel = f"{split}/c{label}/img {i}.png"  # a space in the name: the label is the last field
                _write_image(root / rel, COLOURS[label], size=(20 + i, 24))
                entries[split].append((rel, label))
        lines = ["# relative/path label"] + [f"{rel} {label}" for rel, label in entries[split]]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n\n")
    return root, entries


def test_list_loader_reads_exactly_what_the_lists_say(list_root):
    root, entries = list_root
    source = datasets.load(DataConfig(name="list", root=str(root), train_list="train.txt", val_list="val.txt",
                                      test_list=str(root / "test.txt"), image_size=16))
    assert source.num_classes == 3 and not source.in_memory
    assert list(zip(source.train.paths, source.train.labels.tolist())) == entries["train"]
    assert list(zip(source.test.paths, source.test.labels.tolist())) == entries["test"]
    assert source.val is not None and len(source.val) == 6
    assert source.train_counts.tolist() == TRAIN_PER_CLASS
    # Batches from DataLoader workers: resized, centre-cropped, normalised; labels in shard order.
    feed = Feed(source, torch.device("cpu"), rank=0, world_size=1, seed=0, crop_padding=0, flip=False,
                channels_last=False, num_workers=1)
    x, y = next(feed.eval_batches("test", 12))
    assert x.shape == (12, 3, 16, 16) and y.tolist() == [label for _, label in entries["test"]]
    mean, std = torch.tensor(source.mean).view(3, 1, 1), torch.tensor(source.std).view(3, 1, 1)
    for img, label in zip(x, y.tolist()):
        expected = (torch.tensor(COLOURS[label], dtype=torch.float32).view(3, 1, 1) / 255 - mean) / std
        assert torch.allclose(img, expected.expand(3, 16, 16), atol=1e-5)


def test_file_sets_augment_each_image_under_its_own_seed(list_root):
    # The transforms (RandomResizedCrop, flip, classifier-balancing's ColorJitter) run under the item's
    # seed: the same (image, seed) gives the same tensor in any process or worker, and torch's global
    # generator is left alone.
    from hpc_train.train.data.file_batches import FileImages, _transforms

    root, _ = list_root
    data = datasets.load(DataConfig(name="list", root=str(root), train_list="train.txt", test_list="test.txt"))
    names = [type(t).__name__ for t in _transforms(16, data.mean, data.std, True, 0.4).transforms]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "ToTensor", "Normalize"]
    assert "ColorJitter" not in [type(t).__name__ for t in _transforms(16, data.mean, data.std, True, 0.0).transforms]
    images = FileImages(data.train, _transforms(16, data.mean, data.std, True, 0.4))
    torch.manual_seed(5)
    state = torch.get_rng_state()
    a, b, c = images[(3, 12345)][0], images[(3, 12345)][0], images[(3, 999)][0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), state)


def test_list_training_run_with_workers_and_staging(list_root, tmp_path):
    root, _ = list_root
    stage = tmp_path / "node-local"
    spec = make_spec({
        "epochs": 2, "batch_size": 4, "eval_batch_size": 5, "log_every_steps": 1000,
        "data": {"name": "list", "root": str(root), "train_list": "train.txt", "test_list": "test.txt",
                 "image_size": 16, "num_workers": 2, "stage_to": str(stage)},
        "model": {"name": "small_cnn"}, "optim": {"lr": 0.05},
    })
    outcome = launch.run(spec, run_dir=str(tmp_path / "run"))
    assert outcome.exit_code == 0
    assert outcome.summary["global_step"] == 2 * -(-21 // 4)
    assert outcome.summary["last"]["per_class"] is not None and len(outcome.summary["last"]["per_class"]) == 3
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["count"] == [4, 4, 4]
    staged = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*.png"))
    assert len(staged) == 21 + 12 and "train/c0/img 0.png" in staged
    # Staging again copies nothing (a requeued job does not pay twice).
    assert datasets.stage_list_files(spec.train.data, stage) == 0


def test_list_file_errors(list_root, tmp_path, capsys, restore_signals):
    root, _ = list_root
    (root / "bad.txt").write_text("train/c0/img 0.png 0\ntrain/c0/img 1.png zero\n")
    with pytest.raises(DataError, match=r"bad.txt:2: expected 'relative/path label'"):
        datasets.load(DataConfig(name="list", root=str(root), train_list="bad.txt", test_list="test.txt"))
    (root / "gone.txt").write_text("train/c0/missing.png 0\n")
    with pytest.raises(DataError, match="missing.png does not exist"):
        datasets.load(DataConfig(name="list", root=str(root), train_list="gone.txt", test_list="test.txt"))
    job = tmp_path / "job.yaml"
    job.write_text(f"train:\n  device: cpu\n  data:\n    name: list\n    root: {root}\n"
                   "    train_list: bad.txt\n    test_list: test.txt\n")
    assert main([str(job), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "bad.txt:2" in err and "Traceback" not in err


def test_imagefolder_with_longtail_subsampling(tmp_path):
    root = tmp_path / "folder"
    for name, n in (("ant", 30), ("bee", 25), ("cat", 40)):
        for i in range(n):
            _write_image(root / "train" / name / f"{i:03d}.jpg", (i, 2 * i, 3 * i))
        for i in range(5):
            _write_image(root / "val" / name / f"{i}.png", (9, 9, 9))
    full = datasets.load(DataConfig(name="imagefolder", root=str(root), imbalance_factor=1))
    assert full.class_names == ["ant", "bee", "cat"] and full.train_counts.tolist() == [30, 25, 40]
    assert full.test.labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5  # val/ serves as the test split
    lt = datasets.load(DataConfig(name="imagefolder", root=str(root), imbalance_factor=5, max_per_class=20))
    assert lt.train_counts.tolist() == ldam_counts(20, 3, 5) == [20, 8, 4]
    again = datasets.load(DataConfig(name="imagefolder", root=str(root), imbalance_factor=5, max_per_class=20))
    assert again.train.paths == lt.train.paths  # seeded: the same subset every time
    other = datasets.load(DataConfig(name="imagefolder", root=str(root), imbalance_factor=5, max_per_class=20, seed=1))
    assert other.train.paths != lt.train.paths
    assert np.all(np.diff(lt.train.labels) >= 0)
    with pytest.raises(DataError, match="expected .*train/<class>/<image>"):
        datasets.load(DataConfig(name="imagefolder", root=str(tmp_path / "empty")))


def test_imagenet_lt_recipe_dry_run(list_root, capsys, restore_signals):
    # The shipped ImageNet-LT job on a miniature list-file set: 4 nodes x 8 GPUs, batch 512.
    root, _ = list_root
    for split in ("train", "val", "test"):
        (root / f"ImageNet_LT_{split}.txt").write_text((root / f"{split}.txt").read_text())
    assert main(["jobs/imagenet_lt_resnext50_crt.yaml", "--dry-run", "--set", f"train.data.root={root}"]) == 0
    out = capsys.readouterr().out
    assert "world size     32 (4 node(s) x 8 rank(s))" in out and "per rank 16" in out
    assert "+ 10 cRT (1 steps per epoch, sampler class_aware), then tau-normalisation" in out  # 21 < 512 images
    assert "resnext50_32x4d" in out and "batchnorm      synchronised across ranks" in out
    assert "21 training images, 6 held out, 12 test images" in out
