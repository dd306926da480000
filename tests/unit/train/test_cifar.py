"""CIFAR-10-LT / CIFAR-100-LT from files written in the exact on-disk format of the official
"python version" (CIFAR-10 as Python-2 pickles, CIFAR-100 as Python-3 pickles), full size, so the
long-tail counts are the published ones: 12,406 / 13,996 / 20,431 and 10,847 / 12,608 / 19,573."""

from __future__ import annotations

import pickle
import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")

from hpc_train.config import DataConfig  # noqa: E402
from hpc_train.train.data import datasets  # noqa: E402

from . import cifar_files  # noqa: E402
from .helpers import PYTHON, REPO, clean_env, ldam_counts  # noqa: E402

CIFAR10_IF100 = [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50]  # notes, §1.1 (LDAM-DRW's formula)


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    c10 = cifar_files.make_arrays(10, 5000, 1000, seed=1)
    cifar_files.write_cifar10(root, *c10, py2=True)
    c100 = cifar_files.make_arrays(100, 500, 100, seed=2)
    cifar_files.write_cifar100(root, *c100, py2=False)
    return root, c10, c100


def _ldam_reference(rows, labels, imb_factor):
    """kaidic/LDAM-DRW imbalance_cifar.py, transcribed: global np.random.seed(0), then per class in label
    order shuffle that class's indices and keep the first img_num."""
    state = np.random.get_state()
    try:
        np.random.seed(0)
        cls_num = int(labels.max()) + 1
        img_max = len(rows) / cls_num
        img_num_per_cls = [int(img_max * (imb_factor ** (i / (cls_num - 1.0)))) for i in range(cls_num)]
        new_data, new_targets = [], []
        targets_np = np.array(labels, dtype=np.int64)
        for the_class, the_img_num in zip(np.unique(targets_np), img_num_per_cls):
            idx = np.where(targets_np == the_class)[0]
            np.random.shuffle(idx)
            selec_idx = idx[:the_img_num]
            new_data.append(rows[selec_idx, ...])
            new_targets.extend([the_class] * the_img_num)
        return np.vstack(new_data), np.asarray(new_targets)
    finally:
        np.random.set_state(state)


def test_the_written_files_are_python2_pickles(cifar_root):
    root, (rows, labels, *_), _ = cifar_root
    raw = (root / "cifar-10-batches-py" / "data_batch_1").read_bytes()
    assert raw[:2] == b"\x80\x02"
    with_bytes = pickle.loads(raw, encoding="bytes")  # how third-party code often reads them
    assert set(with_bytes) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert np.array_equal(with_bytes[b"data"], rows[:10000])


@pytest.mark.parametrize("imbalance, total", [(100, 12406), (50, 13996), (10, 20431)])
def test_cifar10_lt_counts_and_pixels(cifar_root, imbalance, total):
    root, (rows, labels, test_rows, test_labels), _ = cifar_root
    source = datasets.load(DataConfig(name="cifar10-lt", root=str(root), imbalance_factor=imbalance))
    counts = source.train_counts.tolist()
    assert sum(counts) == total and counts == ldam_counts(5000, 10, imbalance)
    if imbalance == 100:
        assert counts == CIFAR10_IF100
    # The same images, in the same order, as LDAM-DRW picks; rows are planar R, G, B planes of 32x32.
    ref_rows, ref_labels = _ldam_reference(rows, labels, 1 / imbalance)
    assert np.array_equal(source.train.labels, ref_labels)
    assert np.array_equal(source.train.images, ref_rows.reshape(-1, 3, 32, 32))
    assert source.train.images[0, 1, 0, 0] == ref_rows[0, 1024]  # green plane starts at 1024
    # The full balanced test set, untouched.
    assert np.array_equal(source.test.labels, test_labels) and len(source.test) == 10000
    assert np.array_equal(source.test.images.reshape(10000, -1), test_rows)
    assert source.class_names[3] == "class3"


@pytest.mark.parametrize("imbalance, total", [(100, 10847), (50, 12608), (10, 19573)])
def test_cifar100_lt_counts(cifar_root, imbalance, total):
    root, _, (rows, labels, _, test_labels) = cifar_root
    source = datasets.load(DataConfig(name="cifar100-lt", root=str(root), imbalance_factor=imbalance))
    assert int(source.train_counts.sum()) == total
    ref_rows, ref_labels = _ldam_reference(rows, labels, 1 / imbalance)
    assert np.array_equal(source.train.labels, ref_labels)
    assert np.array_equal(source.train.images, ref_rows.reshape(-1, 3, 32, 32))
    assert np.bincount(source.test.labels).tolist() == [100] * 100


def test_step_profile_and_holdout(cifar_root):
    root, *_ = cifar_root
    step = datasets.load(DataConfig(name="cifar10-lt", root=str(root), imbalance_factor=10, profile="step"))
    assert step.train_counts.tolist() == [5000] * 5 + [500] * 5
    held = datasets.load(DataConfig(name="cifar10-lt", root=str(root), imbalance_factor=100, val_fraction=0.1))
    assert held.val is not None
    assert (held.train_counts + np.bincount(held.val.labels, minlength=10)).tolist() == CIFAR10_IF100
    assert np.bincount(held.val.labels, minlength=10).tolist() == [int(n * 0.1) for n in CIFAR10_IF100]


def test_dry_run_prints_the_exact_counts(cifar_root, tmp_path):
    # The acceptance check, through the real entrypoint (what `hpc-train train` calls).
    root, *_ = cifar_root
    proc = subprocess.run([PYTHON, "-m", "hpc_train.train", "jobs/cifar10_lt_ldam_drw.yaml", "--dry-run",
                           "--set", f"train.data.root={root}"], cwd=REPO, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert " ".join(map(str, CIFAR10_IF100)) in out
    assert "12406 training images" in out and "10000 test images" in out
    assert "many (>100) 8, medium (20-100) 2, few (<20) 0" in out
    assert "world size     1" in out and "per rank 128" in out and "steps per epoch 97" in out  # ceil(12406/128)
    assert "464154 parameters" not in out  # cosine head: no bias ...
    assert "464144 parameters" in out      # ... ResNet-32 is 464,154 with a 10-class linear head, minus 10
    assert not list(tmp_path.glob("runs"))  # a dry run writes nothing


def test_dry_run_cifar100_groups_in_process(cifar_root, capsys, restore_signals):
    from hpc_train.train.__main__ import main

    root, *_ = cifar_root
    assert main(["jobs/cifar100_lt_bs.yaml", "--dry-run", "--set", f"train.data.root={root}",
                 "--set", "slurm.gpus_per_node=4"]) == 0
    out = capsys.readouterr().out
    assert "10847 training images" in out and "many (>100) 35, medium (20-100) 35, few (<20) 30" in out
    assert "world size     4" in out and "per rank 32" in out and "steps per epoch 85" in out  # 2711 / 32


def test_missing_cifar_files_exit_2_naming_them(tmp_path):
    proc = subprocess.run([PYTHON, "-m", "hpc_train.train", "jobs/cifar10_lt_ce.yaml", "--dry-run",
                           "--set", f"train.data.root={tmp_path / 'nowhere'}"], cwd=REPO, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "data_batch_1" in proc.stderr and "cifar-10-batches-py" in proc.stderr and "train.data.root" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2


def test_corrupt_cifar_file_exit_2(cifar_root, tmp_path, capsys, restore_signals):
    from hpc_train.train.__main__ import main

    root, *_ = cifar_root
    broken = tmp_path / "cifar"
    (broken / "cifar-10-batches-py").mkdir(parents=True)
    for f in (root / "cifar-10-batches-py").iterdir():
        (broken / "cifar-10-batches-py" / f.name).symlink_to(f)
    victim = broken / "cifar-10-batches-py" / "data_batch_3"
    victim.unlink()
    victim.write_bytes((root / "cifar-10-batches-py" / "data_batch_3").read_bytes()[:1000])  # truncated
    assert main(["jobs/cifar10_lt_ce.yaml", "--dry-run", "--set", f"train.data.root={broken}"]) == 2
    err = capsys.readouterr().err
    assert "data_batch_3" in err and "Traceback" not in err
