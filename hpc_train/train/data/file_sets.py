"""On-disk data sets: list files (ImageNet-LT / Places-LT / iNaturalist) and ImageFolder trees, as
:class:`~.sources.FileSplit` path lists (DataLoader workers read the images, :mod:`.file_batches`), and
the staging of list-file images to node-local disk (list files are read and checked by
:mod:`.list_files`). Missing or unreadable files raise :class:`~.sources.DataError` (exit 2) naming what was
expected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...config import DataConfig
from . import list_files
from .sources import (IMAGENET_MEAN, IMAGENET_STD, DataError, DataSource, FileSplit, longtail_counts,
                      longtail_indices, take, with_holdout)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def read_list_file(list_path: Path, image_root: Path, num_classes: int | None = None) -> FileSplit:
    """``relative/path label`` per line, every entry checked before any rank trains (:mod:`.list_files`): paths
    under ``image_root``, regular files, labels >= 0 (and below ``num_classes`` where given)."""
    entries = list_files.read_entries(list_path)
    if num_classes is not None:
        list_files.check_labels(entries, list_path, num_classes)
    list_files.check_files(entries, list_path, image_root)
    return _file_split(entries, image_root)


def _file_split(entries: list[list_files.ListEntry], image_root: Path) -> FileSplit:
    return FileSplit(image_root, [e.path for e in entries], np.asarray([e.label for e in entries], dtype=np.int64))


def _resolve_list(root: Path, name: str) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() else root / path


def load_list(cfg: DataConfig, image_root: Path | None = None) -> DataSource:
    """The training list decides the classes (0 .. its largest label, each with an image); the held-out and
    test lists may use only those."""
    root = Path(cfg.root).expanduser()
    images_at = image_root or root
    train_list = _resolve_list(root, cfg.train_list or "")
    entries = list_files.read_entries(train_list)
    num_classes = list_files.class_count(entries, train_list)
    list_files.check_files(entries, train_list, images_at)
    train = _file_split(entries, images_at)
    test = read_list_file(_resolve_list(root, cfg.test_list or ""), images_at, num_classes)
    val = read_list_file(_resolve_list(root, cfg.val_list), images_at, num_classes) if cfg.val_list else None
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
