"""Write CIFAR-10/100 "python version" files byte-for-byte in the official layout (not collected).

The official batches are Python-2 pickles (protocol 2): dict keys and the pixel buffer are Python-2
``str``, i.e. BINSTRING opcodes. A Python-3 ``pickle.dump`` writes unicode keys instead, and code that
loads with ``encoding='bytes'`` (``d[b'data']``) then breaks — so :func:`py2_pickle` emits the opcodes
itself: the file loads as ``str`` keys with ``encoding='latin1'`` and as ``bytes`` keys with
``encoding='bytes'``, with the numpy array intact either way, exactly like the real files.
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np


def _py2_str(out: io.BytesIO, data: bytes) -> None:
    if len(data) < 256:
        out.write(b"U" + bytes([len(data)]) + data)          # SHORT_BINSTRING
    else:
        out.write(b"T" + struct.pack("<I", len(data)) + data)  # BINSTRING


def _int(out: io.BytesIO, value: int) -> None:
    if 0 <= value < 256:
        out.write(b"K" + bytes([value]))                       # BININT1
    else:
        out.write(b"J" + struct.pack("<i", value))              # BININT


def _value(out: io.BytesIO, value: Any) -> None:
    if isinstance(value, np.ndarray):
        _ndarray(out, value)
    elif isinstance(value, str):
        _py2_str(out, value.encode("latin1"))
    elif isinstance(value, bool):
        out.write(b"\x88" if value else b"\x89")
    elif isinstance(value, int):
        _int(out, value)
    elif isinstance(value, list):
        out.write(b"]")                                          # EMPTY_LIST
        for start in range(0, len(value), 1000):
            out.write(b"(")                                      # MARK
            for item in value[start:start + 1000]:
                _value(out, item)
            out.write(b"e")                                      # APPENDS
    else:
        raise TypeError(type(value))


def _ndarray(out: io.BytesIO, arr: np.ndarray) -> None:
    """numpy's own reduce, as Python 2 numpy wrote it: _reconstruct(ndarray, (0,), 'b') + BUILD(state)."""
    assert arr.dtype == np.uint8 and arr.ndim == 2
    out.write(b"cnumpy.core.multiarray\n_reconstruct\n")         # GLOBAL
    out.write(b"cnumpy\nndarray\n")
    _int(out, 0)
    out.write(b"\x85")                                           # TUPLE1
    _py2_str(out, b"b")
    out.write(b"\x87R")                                          # TUPLE3, REDUCE
    out.write(b"(")                                              # MARK: the state tuple
    _int(out, 1)
    _int(out, arr.shape[0])
    _int(out, arr.shape[1])
    out.write(b"\x86")                                           # TUPLE2 (shape)
    out.write(b"cnumpy\ndtype\n")
    _py2_str(out, b"u1")
    out.write(b"\x89\x88\x87R")                                  # False, True, TUPLE3, REDUCE
    out.write(b"(")
    _int(out, 3)
    _py2_str(out, b"|")
    out.write(b"NNN")
    out.write(b"J" + struct.pack("<i", -1) + b"J" + struct.pack("<i", -1))
    _int(out, 0)
    out.write(b"tb")                                             # TUPLE, BUILD (dtype state)
    out.write(b"\x89")                                           # not Fortran order
    _py2_str(out, np.ascontiguousarray(arr).tobytes())
    out.write(b"tb")                                             # TUPLE, BUILD (array state)


def py2_pickle(obj: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(b"\x80\x02}(")                                     # PROTO 2, EMPTY_DICT, MARK
    for key, value in obj.items():
        _py2_str(out, key.encode("latin1"))
        _value(out, value)
    out.write(b"u.")                                             # SETITEMS, STOP
    return out.getvalue()


def _dump(path: Path, obj: dict[str, Any], py2: bool) -> None:
    # Python 3: the protocol pickle.dump writes by default (4; HIGHEST_PROTOCOL, 5, stores arrays through
    # numpy's _frombuffer, a name no CIFAR file holds and the loader refuses).
    path.write_bytes(py2_pickle(obj) if py2 else pickle.dumps(obj, protocol=4))


def make_arrays(num_classes: int, train_per_class: int, test_per_class: int, seed: int):
    """Shuffled labels (as in the real files) and random pixels, rows in CIFAR's planar layout."""
    rng = np.random.RandomState(seed)
    train_labels = rng.permutation(np.repeat(np.arange(num_classes), train_per_class))
    test_labels = rng.permutation(np.repeat(np.arange(num_classes), test_per_class))
    train_rows = rng.randint(0, 256, size=(len(train_labels), 3072), dtype=np.uint8)
    test_rows = rng.randint(0, 256, size=(len(test_labels), 3072), dtype=np.uint8)
    return train_rows, train_labels, test_rows, test_labels


def learnable_arrays(num_classes: int, train_per_class: int, test_per_class: int, seed: int, signal: float = 0.3):
    """Like :func:`make_arrays`, but learnable: each class has its own coarse colour pattern (4 × 4 blocks of
    8 × 8 pixels, so crops and flips keep it), every image is ``signal`` × its class's pattern + the rest random
    pixels."""
    rng = np.random.RandomState(seed)
    patterns = rng.randint(0, 256, size=(num_classes, 3, 4, 4)).astype(np.float32).repeat(8, 2).repeat(8, 3)

    def images(labels):
        noise = rng.randint(0, 256, size=(len(labels), 3, 32, 32)).astype(np.float32)
        mixed = signal * patterns[labels] + (1 - signal) * noise
        return np.clip(mixed, 0, 255).astype(np.uint8).reshape(len(labels), 3072)

    train_labels = rng.permutation(np.repeat(np.arange(num_classes), train_per_class))
    test_labels = rng.permutation(np.repeat(np.arange(num_classes), test_per_class))
    return images(train_labels), train_labels, images(test_labels), test_labels


def write_cifar10(root: Path, train_rows, train_labels, test_rows, test_labels, *, py2: bool = True) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    per_batch = len(train_labels) // 5
    for i in range(5):
        sl = slice(i * per_batch, (i + 1) * per_batch)
        _dump(folder / f"data_batch_{i + 1}", {
            "batch_label": f"training batch {i + 1} of 5", "labels": [int(v) for v in train_labels[sl]],
            "data": train_rows[sl], "filenames": [f"img_{i}_{j}.png" for j in range(per_batch)]}, py2)
    _dump(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": [int(v) for v in test_labels],
                                  "data": test_rows, "filenames": [f"t_{j}.png" for j in range(len(test_labels))]}, py2)
    _dump(folder / "batches.meta", {"num_cases_per_batch": per_batch, "num_vis": 3072,
                                    "label_names": [f"class{c}" for c in range(10)]}, py2)
    return folder


def write_cifar100(root: Path, train_rows, train_labels, test_rows, test_labels, *, py2: bool = False) -> Path:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    coarse = lambda labels: [int(v) // 5 for v in labels]  # noqa: E731 - present in the real files, unused
    _dump(folder / "train", {"filenames": [f"f{j}.png" for j in range(len(train_labels))], "batch_label": "training batch 1 of 1",
                             "fine_labels": [int(v) for v in train_labels], "coarse_labels": coarse(train_labels),
                             "data": train_rows}, py2)
    _dump(folder / "test", {"filenames": [f"t{j}.png" for j in range(len(test_labels))], "batch_label": "testing batch 1 of 1",
                            "fine_labels": [int(v) for v in test_labels], "coarse_labels": coarse(test_labels),
                            "data": test_rows}, py2)
    _dump(folder / "meta", {"fine_label_names": [f"fine{c}" for c in range(100)],
                            "coarse_label_names": [f"coarse{c}" for c in range(20)]}, py2)
    return folder
