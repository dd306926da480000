"""On-disk data sets: list files (ImageNet-LT / Places-LT / iNaturalist) and ImageFolder trees, as
:class:`~.sources.FileSplit` path lists (DataLoader workers read the images, :mod:`.file_batches`), and
the staging of list-file images to node-local disk. Missing or unreadable files raise
:class:`~.sources.DataError` (exit 2) naming what was expected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...config import DataConfig
from .sources import (IMAGENET_MEAN, IMAGENET_STD, DataError, DataSource, FileSplit, longtail_counts,
                      longtail_indices, take, with_holdout)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")




def read_list_file(list_path: Path, image_root: Path) -> FileSplit:
    """``relative/path label`` per line (blank lines and ``#`` comments skipped; the path may contain
    spaces, the label is the last field)."""
    try:
        lines = list_path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"list file not found: {list_path}; set train.data.train_list/test_list "
                        "(absolute, or relative to train.data.root)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read list file {list_path}: {exc}") from None
    paths, labels = [], []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.rsplit(None, 1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit() or int(parts[1]) < 0:
            raise DataError(f"{list_path}:{number}: expected 'relative/path label' with an integer label >= 0, "
                            f"got {text!r}")
        paths.append(parts[0])
        labels.append(int(parts[1]))
    if not paths:
        raise DataError(f"list file {list_path} has no entries")
    split = FileSplit(image_root, paths, np.asarray(labels, dtype=np.int64))
    _check_some_files(split, str(list_path))
    return split


def _check_some_files(split: FileSplit, what: str) -> None:
    # Stat a few entries, not all: 100k+ stats on a network filesystem would take a while. A file that
    # goes missing later fails in the loader with its path in the message.
    picks = sorted({0, len(split.paths) // 2, len(split.paths) - 1})
    missing = [split.paths[i] for i in picks if not (split.root / split.paths[i]).is_file()]
    if missing:
        raise DataError(f"{what}: image {split.root / missing[0]} does not exist; train.data.root must be the "
                        "directory the list's relative paths start from")


def _resolve_list(root: Path, name: str) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() else root / path


def load_list(cfg: DataConfig, image_root: Path | None = None) -> DataSource:
    root = Path(cfg.root).expanduser()
    images_at = image_root or root
    train = read_list_file(_resolve_list(root, cfg.train_list or ""), images_at)
    test = read_list_file(_resolve_list(root, cfg.test_list or ""), images_at)
    val = read_list_file(_resolve_list(root, cfg.val_list), images_at) if cfg.val_list else None
    num_classes = int(max(train.labels.max(), test.labels.max(), val.labels.max() if val else 0)) + 1
    if val is None:
        train, val = with_holdout(train, cfg)
    return DataSource("list", num_classes, train, test, val, IMAGENET_MEAN, IMAGENET_STD, 3, cfg.image_size,
                      [str(i) for i in range(num_classes)])


def _scan_folder(folder: Path, classes: list[str] | None = None) -> tuple[FileSplit, list[str]]:
    if classes is None:
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{folder} has no class sub-directories; ImageFolder expects {folder}/<class>/<image>")
    paths, labels = [], []
    for label, name in enumerate(classes):
        class_dir = folder / name
        if not class_dir.is_dir():
            raise DataError(f"{class_dir} is missing; the test folder needs the same classes as train/")
        for p in sorted(class_dir.rglob("*")):
            if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file():
                paths.append(str(p.relative_to(folder)))
                labels.append(label)
    if not paths:
        raise DataError(f"{folder} has no images ({', '.join(IMAGE_EXTENSIONS)})")
    return FileSplit(folder, paths, np.asarray(labels, dtype=np.int64)), classes


def load_imagefolder(cfg: DataConfig) -> DataSource:
    """``root/train/<class>/*`` and ``root/test/<class>/*`` (or ``root/val``). With imbalance_factor > 1
    the training classes (sorted by name, the first is the head) are cut to the LDAM-DRW profile with
    n_max = min(smallest class, ``max_per_class``)."""
    root = Path(cfg.root).expanduser()
    train_dir = root / "train"
    test_dir = next((root / n for n in ("test", "val") if (root / n).is_dir()), None)
    if not train_dir.is_dir() or test_dir is None:
        raise DataError(f"imagefolder: expected {train_dir}/<class>/<image> and {root}/test/<class>/<image> "
                        "(or val/); set train.data.root")
    train, classes = _scan_folder(train_dir)
    test, _ = _scan_folder(test_dir, classes)
    if cfg.imbalance_factor > 1:
        sizes = np.bincount(train.labels, minlength=len(classes))
        counts = longtail_counts(min(int(sizes.min()), cfg.max_per_class), len(classes), cfg.imbalance_factor,
                                 cfg.profile)
        train = take(train, longtail_indices(train.labels, counts, cfg.seed))
    train, val = with_holdout(train, cfg)
    return DataSource("imagefolder", len(classes), train, test, val, IMAGENET_MEAN, IMAGENET_STD, 3,
                      cfg.image_size, classes)


def stage_list_files(cfg: DataConfig, dest: Path, *, part: int = 0, parts: int = 1) -> int:
    """Copy the images the list files name from ``cfg.root`` to ``dest`` (same relative paths): this
    caller's share, every ``parts``-th file from ``part`` on (the ranks of a node split the copying).
    Files already there with the same size are kept, so a requeued job does not copy again. Returns the
    number of files copied."""
    import shutil

    root = Path(cfg.root).expanduser()
    names = []
    for name in (cfg.train_list, cfg.val_list, cfg.test_list):
        if name:
            names += read_list_file(_resolve_list(root, name), root).paths
    copied = 0
    for rel in sorted(set(names))[part::parts]:
        src, dst = root / rel, dest / rel
        try:
            if dst.is_file() and dst.stat().st_size == src.stat().st_size:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".partial")
            shutil.copyfile(src, tmp)
            tmp.replace(dst)
        except OSError as exc:
            raise DataError(f"staging {src} to {dst} failed: {exc}; fix or unset train.data.stage_to") from None
        copied += 1
    return copied
