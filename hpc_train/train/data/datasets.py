"""Data sets as plain arrays and file lists (numpy only; tensors are made in :mod:`.pipeline`).

Every loader returns a :class:`DataSource`: a long-tailed training split, an optional held-out split
(for choosing τ) and a balanced test split, either in memory (``ArraySplit``: uint8 ``N×C×H×W``) or on
disk (``FileSplit``: image paths). The long tail is cut exactly as kaidic/LDAM-DRW cuts CIFAR
(``imbalance_cifar.py``): n_i = int(n_max · (1/IF)^(i/(C-1))) for the ``exp`` profile, a seeded
``RandomState`` shuffling each class's indices in label order and keeping the first n_i, and the
untouched test set. CIFAR-10-LT at IF 100 then has 12,406 training images, CIFAR-100-LT 10,847.

On-disk sets (list files, ImageFolder) and their staging are in :mod:`.file_sets`. Missing or corrupt
files raise :class:`DataError` (exit 2) naming what was expected. Nothing is ever
downloaded unless ``train.data.download`` is true.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ...config import DataConfig
from ...config.plugins import is_import_path
from ...errors import ConfigError
from ...plugin_loading import call as call_plugin
from .file_sets import load_imagefolder, load_list, read_list_file, stage_list_files  # noqa: F401 (re-exported)
from .sources import (IMAGENET_MEAN, IMAGENET_STD, ArraySplit, DataError, DataSource, FileSplit,  # noqa: F401
                      Split, holdout_indices, longtail_counts, longtail_indices, take, with_holdout)

# LDAM-DRW normalises CIFAR-100 with the CIFAR-10 statistics too; we keep that, the recipe is the point.
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


# --------------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (the official "python version" pickles)
# --------------------------------------------------------------------------------------------------

CIFAR_LAYOUT = {
    "cifar10-lt": dict(folder="cifar-10-batches-py", train=[f"data_batch_{i}" for i in range(1, 6)],
                       test=["test_batch"], meta="batches.meta", label_key="labels", names_key="label_names",
                       archive="cifar-10-python.tar.gz", num_classes=10),
    "cifar100-lt": dict(folder="cifar-100-python", train=["train"], test=["test"], meta="meta",
                        label_key="fine_labels", names_key="fine_label_names", archive="cifar-100-python.tar.gz",
                        num_classes=100),
}


def _numpy_reconstruct() -> Callable[..., np.ndarray]:
    try:  # numpy 2 moved numpy.core to numpy._core (and pickles under that name)
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


_CIFAR_GLOBALS: dict[tuple[str, str], Callable[[], object]] = {
    ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,  # the same function, as numpy 2 names it
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
}
"""Every global the official CIFAR files name (Python 2 numpy's array reconstruction); containers, bytes, text
and numbers need none. A file that names anything else is not one of them."""


class _CifarUnpickler(pickle.Unpickler):
    """A data file is data: this unpickler builds dicts, lists, bytes, str, numbers and numpy arrays, and refuses
    (before calling it) any other callable a pickle names — ``os.system``, ``builtins.eval``, a numpy gadget."""

    def __init__(self, handle: Any, path: Path) -> None:
        super().__init__(handle, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        found = _CIFAR_GLOBALS.get((module, name))
        if (module, name) == ("_codecs", "encode"):  # how Python 3's protocol 2 writes bytes: not the official file
            raise DataError(f"{self.path} was re-pickled by Python 3 (it names _codecs.encode, which no official "
                            "CIFAR file holds); it was not read: re-extract the official archive")
        if found is None:
            raise DataError(f"{self.path} asks to load {module}.{name}, which no CIFAR file holds; it was not read "
                            "(a data file is data, never code): re-extract the official archive")
        return found()

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a CIFAR file has no persistent references")


def _unpickle(path: Path) -> dict:
    # The official files are Python-2 pickles: latin1 turns their byte strings into str keys and keeps
    # the pixel bytes intact (encoding="bytes" would give b"data" keys instead).
    with open(path, "rb") as f:
        try:
            obj = _CifarUnpickler(f, path).load()
        except DataError:
            raise
        except MemoryError:
            raise DataError(f"{path} asks for more memory than a CIFAR file holds; re-extract the official archive") from None
        except Exception as exc:  # a damaged file fails inside the unpickler every way there is: BUILD on a
            # dict (AttributeError), numpy's own __setstate__ (SystemError, OverflowError), a short buffer ...
            raise DataError(f"{path} is not a CIFAR python batch ({exc.__class__.__name__}: {exc}); re-extract "
                            "the official archive") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a dict, got {type(obj).__name__}")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _read_cifar_batches(folder: Path, files: list[str], label_key: str) -> ArraySplit:
    data, labels = [], []
    for name in files:
        path = folder / name
        try:
            entry = _unpickle(path)
            rows = np.asarray(entry["data"], dtype=np.uint8)
            labs = np.asarray(entry[label_key], dtype=np.int64)
            if rows.ndim != 2 or rows.shape[1] != 3072 or labs.ndim != 1 or len(rows) != len(labs):
                raise ValueError(f"data is {rows.shape} with {labs.shape} labels, expected N x 3072 and N labels")
            if labs.min(initial=0) < 0:
                raise ValueError(f"a label is {labs.min()}, below 0")
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, ValueError, TypeError, OverflowError) as exc:
            raise DataError(f"{path} is unreadable or not a CIFAR python batch ({exc.__class__.__name__}: {exc}); "
                            "re-extract the official archive") from None
        data.append(rows)
        labels.append(labs)
    # Each row is 1024 red, 1024 green, 1024 blue values of a row-major 32x32 image: already C x H x W.
    return ArraySplit(np.concatenate(data).reshape(-1, 3, 32, 32), np.concatenate(labels))


def load_cifar_lt(cfg: DataConfig, *, download_ok: bool = True) -> DataSource:
    layout = CIFAR_LAYOUT[cfg.name]
    root = Path(cfg.root).expanduser()
    folder = root / layout["folder"]
    expected = [*layout["train"], *layout["test"], layout["meta"]]
    missing = [n for n in expected if not (folder / n).is_file()]
    if missing and cfg.download and download_ok:
        _download_cifar(cfg.name, root)
        missing = [n for n in expected if not (folder / n).is_file()]
    if missing:
        raise DataError(
            f"{cfg.name}: missing {', '.join(missing)} in {folder} (the official python version, "
            f"{layout['archive']} extracted under train.data.root); set train.data.root=DIR, "
            "or train.data.download=true where the node can reach the internet"
        )
    try:
        meta = _unpickle(folder / layout["meta"])
        class_names = [str(n) for n in meta[layout["names_key"]]]
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, ValueError, TypeError) as exc:
        raise DataError(f"{folder / layout['meta']} is unreadable ({exc}); re-extract the official archive") from None
    train_full = _read_cifar_batches(folder, layout["train"], layout["label_key"])
    test = _read_cifar_batches(folder, layout["test"], layout["label_key"])
    num_classes = layout["num_classes"]
    if len(class_names) != num_classes or train_full.labels.max(initial=0) >= num_classes:
        raise DataError(f"{folder}: expected {num_classes} classes; is this the right CIFAR version?")
    n_max = len(train_full) / num_classes  # LDAM-DRW: img_max = len(data) / cls_num
    counts = longtail_counts(n_max, num_classes, cfg.imbalance_factor, cfg.profile)
    train = take(train_full, longtail_indices(train_full.labels, counts, cfg.seed))
    train, val = with_holdout(train, cfg)
    return DataSource(cfg.name, num_classes, train, test, val, CIFAR_MEAN, CIFAR_STD, 3, 32, class_names)


def _download_cifar(name: str, root: Path) -> None:
    """The official archive, checked against torchvision's MD5 and extracted; read by :func:`_unpickle` like any
    other (building torchvision's data set class would load the files with a plain ``pickle.load``)."""
    from torchvision import datasets  # only when download: true
    from torchvision.datasets.utils import download_and_extract_archive

    cls = datasets.CIFAR10 if name == "cifar10-lt" else datasets.CIFAR100
    try:
        download_and_extract_archive(cls.url, str(root), filename=cls.filename, md5=cls.tgz_md5)
    except Exception as exc:  # network errors come in many types
        raise DataError(f"{name}: download into {root} failed ({exc}); fetch the archive by hand") from None


# --------------------------------------------------------------------------------------------------
# digits-lt: scikit-learn's bundled real handwritten digits (offline demo data)
# --------------------------------------------------------------------------------------------------


def _read_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``digits.csv.gz`` (64 pixels then the label per row), read directly: importing
    ``sklearn.datasets`` pulls in scipy and costs seconds in every rank. Same arrays as ``load_digits``."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for base in (spec.submodule_search_locations or []) if spec else []:
        path = Path(base) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("digits-lt needs scikit-learn (its bundled digits): pip install scikit-learn") from None
    digits = load_digits()
    return digits.data, digits.target.astype(np.int64)


def load_digits_lt(cfg: DataConfig) -> DataSource:
    """1,797 real 8×8 digits (0–16 grey levels → uint8). Per class, in label order, one
    ``RandomState(data.seed)`` shuffles the class's images; the first ``test_per_class`` form the balanced
    test split, the rest the pool. The long tail is cut from the pools with the LDAM-DRW profile, n_max
    being the smallest pool (so every class can supply its share)."""
    pixels, labels = _read_sklearn_digits()
    images = np.rint(pixels.reshape(-1, 1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)
    rng = np.random.RandomState(cfg.seed)
    test_idx, pools = [], []
    for cls in range(10):
        idx = np.where(labels == cls)[0]
        rng.shuffle(idx)
        if len(idx) <= cfg.test_per_class:
            raise DataError(f"digits-lt: class {cls} has {len(idx)} images; lower train.data.test_per_class")
        test_idx.append(idx[: cfg.test_per_class])
        pools.append(idx[cfg.test_per_class:])
    counts = longtail_counts(min(len(p) for p in pools), 10, cfg.imbalance_factor, cfg.profile)
    train_idx = np.concatenate([p[:n] for p, n in zip(pools, counts)])
    train = ArraySplit(images[train_idx], labels[train_idx])
    test = ArraySplit(images[np.concatenate(test_idx)], labels[np.concatenate(test_idx)])
    train, val = with_holdout(train, cfg)
    pixels = train.images.astype(np.float64) / 255.0
    mean, std = (float(pixels.mean()),), (float(pixels.std()),)
    return DataSource("digits-lt", 10, train, test, val, mean, std, 1, 8, [str(i) for i in range(10)])


# --------------------------------------------------------------------------------------------------
# synthetic-lt: generated, learnable, for throughput and tests
# --------------------------------------------------------------------------------------------------


def load_synthetic_lt(cfg: DataConfig) -> DataSource:
    """Each class is a smooth random colour pattern; images are the pattern plus noise, shifted a few
    pixels (so crops and flips matter but the task stays learnable). Deterministic in ``data.seed``."""
    rng = np.random.RandomState(cfg.seed)
    c, s = cfg.num_classes, cfg.image_size
    coarse = rng.uniform(40, 215, size=(c, 3, 4, 4))
    protos = np.repeat(np.repeat(coarse, -(-s // 4), axis=2), -(-s // 4), axis=3)[:, :, :s, :s]
    counts = longtail_counts(cfg.max_per_class, c, cfg.imbalance_factor, cfg.profile)

    def make(per_class: Sequence[int]) -> ArraySplit:
        labels = np.repeat(np.arange(c, dtype=np.int64), per_class)
        noise = rng.normal(0, 40, size=(len(labels), 3, s, s))
        shifts = rng.randint(-2, 3, size=(len(labels), 2))
        imgs = protos[labels] + noise
        for i, (dy, dx) in enumerate(shifts):
            imgs[i] = np.roll(imgs[i], (dy, dx), axis=(1, 2))
        return ArraySplit(np.clip(imgs, 0, 255).astype(np.uint8), labels)

    train = make(counts)
    test = make([cfg.test_per_class] * c)
    train, val = with_holdout(train, cfg)
    return DataSource("synthetic-lt", c, train, test, val, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 3, s,
                      [str(i) for i in range(c)])


Loader = Callable[[DataConfig, "Path | None", bool], DataSource]
"""``(data config, staged image root, may download) -> DataSource``."""

DATASETS: dict[str, Loader] = {
    "cifar10-lt": lambda cfg, _root, download_ok: load_cifar_lt(cfg, download_ok=download_ok),
    "cifar100-lt": lambda cfg, _root, download_ok: load_cifar_lt(cfg, download_ok=download_ok),
    "digits-lt": lambda cfg, _root, _download: load_digits_lt(cfg),
    "synthetic-lt": lambda cfg, _root, _download: load_synthetic_lt(cfg),
    "list": lambda cfg, image_root, _download: load_list(cfg, image_root),
    "imagefolder": lambda cfg, _root, _download: load_imagefolder(cfg),
}
"""The built-in data sets, by the names ``train.data.name`` takes (``config.DatasetName``: a test ties them)."""


def load_plugin_data(cfg: DataConfig) -> DataSource:
    """A plug-in data set (docs/training.md, Plug-ins): ``load(config=data_config, **args)`` returns a
    :class:`DataSource` (``ArraySplit``: uint8 ``N×C×H×W`` in memory; ``FileSplit``: image files)."""
    data = call_plugin(cfg.name, "data", dict(cfg.args), config=cfg)
    if not isinstance(data, DataSource):
        raise ConfigError(f"train.data.name: {cfg.name} returned {type(data).__name__}; a plug-in data set returns "
                          "a hpc_train.train.data.datasets.DataSource")
    return data


def load(cfg: DataConfig, *, image_root: Path | None = None, download_ok: bool = True) -> DataSource:
    """The data set ``cfg`` names: a built-in one, or a plug-in's (:func:`load_plugin_data`). ``image_root``
    replaces ``cfg.root`` for list-file images (staging)."""
    if is_import_path(cfg.name):
        return load_plugin_data(cfg)
    return DATASETS[cfg.name](cfg, image_root, download_ok)
