"""Hostile list files (issue 28, item 5): a list file is data, checked in full before any rank trains. Paths stay
under the image root (no absolute path, no '..', no symlink out), every file named is a regular file, labels are
integers within the training list's classes; a wrong line is exit 2 naming file:line. Real files, symlinks, a
FIFO and a device node (root: mknod), nothing faked.

Most cases call the loader (milliseconds each); one goes through ``train --dry-run`` and one through ``train``
itself, whose refusal must come before anything is trained or checkpointed."""

from __future__ import annotations

import json
import os
import stat

import pytest

torch = pytest.importorskip("torch")

from hpc_train.config import DataConfig  # noqa: E402
from hpc_train.train.data import datasets  # noqa: E402
from hpc_train.train.data.datasets import DataError  # noqa: E402

CLASSES = 3
PER_CLASS = 5  # the old check sampled first, middle and last entry: 15 entries leave 12 unchecked


@pytest.fixture
def root(tmp_path):
    """root/img/c<k>/<i>.png (regular files; their bytes are never decoded here), train.txt, test.txt, and a secret
    beside the root that no list may reach."""
    data = tmp_path / "data"
    lines = []
    for label in range(CLASSES):
        for i in range(PER_CLASS):
            rel = f"img/c{label}/{i}.png"
            (data / rel).parent.mkdir(parents=True, exist_ok=True)
            (data / rel).write_bytes(b"png")
            lines.append(f"{rel} {label}")
    (data / "train.txt").write_text("\n".join(lines) + "\n")
    (data / "test.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.png").write_bytes(b"secret")
    return data


def _replace_line(path, index, line):
    lines = path.read_text().splitlines()
    lines[index] = line
    path.write_text("\n".join(lines) + "\n")


def _load(root, **lists):
    return datasets.load(DataConfig(name="list", root=str(root), train_list=lists.get("train", "train.txt"),
                                    test_list=lists.get("test", "test.txt"), val_list=lists.get("val")))


def _plant_symlink_out(root):
    os.symlink(root.parent / "secret" / "key.png", root / "img" / "c0" / "link.png")
    return "img/c0/link.png 0"


def _plant_dir_symlink_out(root):
    os.symlink(root.parent / "secret", root / "img" / "away")
    return "img/away/key.png 0"


def _plant_fifo(root):
    os.mkfifo(root / "img" / "c0" / "fifo.png")
    return "img/c0/fifo.png 0"


def _plant_device(root):
    os.mknod(root / "img" / "c0" / "zero.png", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    return "img/c0/zero.png 0"


def _plant_symlink_to_device(root):
    os.symlink("/dev/zero", root / "img" / "c0" / "devzero.png")
    return "img/c0/devzero.png 0"


def _plant_directory(root):
    return "img/c1 0"


# (id, the line put at line 3 of train.txt — or a planting function returning it, what the refusal says)
TRAIN_LINES = [
    ("absolute path", lambda r: f"{r.parent}/secret/key.png 0", "leaves the image root"),
    ("etc passwd", lambda r: "/etc/passwd 0", "leaves the image root"),
    ("dot-dot", lambda r: "../secret/key.png 0", "leaves the image root"),
    ("dot-dot inside", lambda r: "img/c0/../../../secret/key.png 0", "leaves the image root"),
    ("symlink out", _plant_symlink_out, "symlink out of the image root"),
    ("directory symlink out", _plant_dir_symlink_out, "leads out of the image root"),
    ("FIFO", _plant_fifo, "is not a regular file"),
    ("device node", _plant_device, "is not a regular file"),
    ("symlink to /dev/zero", _plant_symlink_to_device, "symlink out of the image root"),
    ("a directory", _plant_directory, "is not a regular file"),
    ("missing, not sampled", lambda r: "img/c0/missing.png 0", "does not exist"),
    ("missing directory", lambda r: "img/nowhere/x.png 0", "does not exist"),
    ("file as directory", lambda r: "img/c0/1.png/x.png 0", "does not exist"),
    ("NUL byte", lambda r: "img/c0/\0.png 0", "leaves the image root"),
    ("control characters", lambda r: "img/c0/\x1b[2J.png 0", "does not exist"),
    ("huge label", lambda r: "img/c0/1.png 999999999999", "class 3 has no image"),
    ("label gap", lambda r: "img/c0/1.png 4", "class 3 has no image"),
    ("negative label", lambda r: "img/c0/1.png -1", "integer label >= 0"),
    ("word label", lambda r: "img/c0/1.png zero", "integer label >= 0"),
    ("non-ASCII digit label", lambda r: "img/c0/1.png \u0661", "integer label >= 0"),
    ("float label", lambda r: "img/c0/1.png 1.0", "integer label >= 0"),
    ("no label", lambda r: "img/c0/1.png", "integer label >= 0"),
]


@pytest.mark.parametrize("line, says", [c[1:] for c in TRAIN_LINES], ids=[c[0] for c in TRAIN_LINES])
def test_a_hostile_training_list_line_is_refused_naming_file_and_line(root, line, says):
    _replace_line(root / "train.txt", 2, line(root))
    with pytest.raises(DataError) as refused:
        _load(root)
    text = str(refused.value)
    assert says in text and "\n" not in text, text
    where = "train.txt" if "class 3 has no image" in says else "train.txt:3"
    assert where in text, text


@pytest.mark.parametrize("which", ["test", "val"])
def test_a_held_out_or_test_label_outside_the_training_classes_is_refused(root, which):
    (root / "other.txt").write_text("img/c0/0.png 0\nimg/c1/0.png 3\n")
    with pytest.raises(DataError, match=r"other.txt:2: label 3 is not a class of the training list \(it has 3"):
        _load(root, **{which: "other.txt"})


@pytest.mark.parametrize("which", ["test", "val"])
def test_a_held_out_or_test_path_out_of_the_root_is_refused(root, which):
    (root / "other.txt").write_text("img/c0/0.png 0\n../secret/key.png 1\n")
    with pytest.raises(DataError, match=r"other.txt:2: \.\./secret/key.png leaves the image root"):
        _load(root, **{which: "other.txt"})


def test_a_list_file_that_is_a_fifo_is_refused_not_waited_on(root):
    os.mkfifo(root / "fifo.txt")
    with pytest.raises(DataError, match="fifo.txt is not a regular file"):
        _load(root, train="fifo.txt")


def test_staging_copies_nothing_from_outside_the_root(root, tmp_path):
    # stage_to copies what the lists name to node-local disk: a path out of the root must not be copied there.
    _replace_line(root / "train.txt", 0, "../secret/key.png 0")
    stage = tmp_path / "stage"
    with pytest.raises(DataError, match="train.txt:1: ../secret/key.png leaves the image root"):
        datasets.stage_list_files(DataConfig(name="list", root=str(root), train_list="train.txt",
                                             test_list="test.txt"), stage)
    assert not stage.exists()


def test_inert_a_symlink_inside_the_root_and_a_clean_list_load(root):
    # Positive controls: links within the root are fine, and every class and entry is kept.
    os.symlink(root / "img" / "c2" / "0.png", root / "img" / "c2" / "again.png")
    _replace_line(root / "train.txt", 14, "img/c2/again.png 2")
    source = _load(root)
    assert source.num_classes == CLASSES and len(source.train.paths) == CLASSES * PER_CLASS
    assert source.train_counts.tolist() == [PER_CLASS] * CLASSES


def _job(tmp_path, root):
    job = tmp_path / "job.yaml"
    job.write_text(f"name: lists\nruns_dir: {tmp_path / 'runs'}\ntrain:\n  device: cpu\n  epochs: 1\n"
                   f"  model: {{name: small_cnn}}\n  data:\n    name: list\n    root: {root}\n"
                   "    train_list: train.txt\n    test_list: test.txt\n    image_size: 8\n")
    return job


@pytest.fixture
def own_signals(isolated_launch_env):
    """main() installs the rank's signal handlers; the pytest process gets its own back afterwards."""
    import signal

    from hpc_train.rank import preempt

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    preempt.reset()


def test_train_dry_run_and_train_refuse_before_any_rank_trains(root, tmp_path, capsys, own_signals):
    from hpc_train.train.__main__ import main

    _replace_line(root / "train.txt", 7, "../secret/key.png 1")
    job = _job(tmp_path, root)
    assert main([str(job), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "train.txt:8: ../secret/key.png leaves the image root" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2, err
    run_dir = tmp_path / "runs" / "lists" / "refused"
    assert main([str(job), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "train.txt:8" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    failed = [json.loads(line) for line in (run_dir / "state.jsonl").read_text().splitlines()]
    assert failed[-1]["event"] == "failed" and "train.txt:8" in failed[-1]["reason"]
    assert failed[-1]["exit_code"] == 2
