"""Data files are data (issue 19, item 2): CIFAR batches are read by a restricted unpickler that builds only
what the official files hold, and a crafted file that would run code when unpickled is refused (exit 2)
before it runs anything. Checkpoints are read with torch's weights-only unpickler (its own allow-list)."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("torch")

from hpc_train.config import DataConfig  # noqa: E402
from hpc_train.errors import HpcTrainError  # noqa: E402
from hpc_train.train.data import datasets  # noqa: E402

from . import cifar_files  # noqa: E402


def _cifar100(tmp_path, py2=True):
    arrays = cifar_files.make_arrays(100, 5, 2, seed=3)
    return cifar_files.write_cifar100(tmp_path, *arrays, py2=py2)


def _load(tmp_path):
    return datasets.load(DataConfig(name="cifar100-lt", root=str(tmp_path), imbalance_factor=5), download_ok=False)


def _payload(module: str, name: str, argument: str) -> bytes:
    """A pickle that calls ``module.name(argument)`` as it is loaded (what the crafted file in the issue did),
    inside the dict a CIFAR batch is."""
    return (b"\x80\x02}q\x00(X\x04\x00\x00\x00dataq\x01c" + module.encode() + b"\n" + name.encode() + b"\n"
            + b"X" + len(argument).to_bytes(4, "little") + argument.encode() + b"\x85Ru.")


@pytest.mark.parametrize("py2", [True, False], ids=["python2-official", "python3-protocol-4"])
def test_official_format_files_load(tmp_path, py2):
    _cifar100(tmp_path, py2)
    source = _load(tmp_path)
    assert source.num_classes == 100 and len(source.test) == 200


@pytest.mark.parametrize("target", [("os", "system"), ("posix", "system"), ("builtins", "eval"),
                                    ("subprocess", "getoutput")], ids=lambda t: ".".join(t))
def test_a_crafted_file_is_refused_before_it_runs_anything(tmp_path, target):
    folder = _cifar100(tmp_path)
    marker = tmp_path / "RAN"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()" if target[1] == "eval" else f"touch {marker}"
    crafted = _payload(*target, code)
    # The payload is real: a plain pickle.load (the old reader) runs it.
    pickle.loads(crafted, encoding="latin1")
    assert marker.exists()
    marker.unlink()
    (folder / "train").write_bytes(crafted)
    with pytest.raises(HpcTrainError) as refused:
        _load(tmp_path)
    assert refused.value.exit_code == 2 and "asks to load" in str(refused.value) and str(folder / "train") in str(refused.value)
    assert not marker.exists(), "unpickling the crafted file ran its code"


def test_the_meta_file_is_read_the_same_way(tmp_path):
    folder = _cifar100(tmp_path)
    marker = tmp_path / "RAN"
    (folder / "meta").write_bytes(_payload("os", "system", f"touch {marker}"))
    with pytest.raises(HpcTrainError, match="asks to load os.system"):
        _load(tmp_path)
    assert not marker.exists()


def test_an_array_made_another_way_is_not_an_official_file(tmp_path):
    # pickle's highest protocol stores arrays through numpy's _frombuffer: harmless, but no CIFAR file holds it.
    folder = _cifar100(tmp_path)
    (folder / "test").write_bytes(pickle.dumps({"data": __import__("numpy").zeros((2, 3072), "uint8"),
                                                "fine_labels": [0, 1]}, protocol=5))
    with pytest.raises(HpcTrainError, match="_frombuffer, which no CIFAR file holds"):
        _load(tmp_path)


def _batch(rows: int = 2, labels=None) -> bytes:
    """An official-format (Python 2) batch of ``rows`` images, as the official files hold them (``labels=[]``:
    none, so that the tests can append their own after the last item)."""
    import numpy as np

    data = np.arange(rows * 3072, dtype=np.uint8).reshape(rows, 3072)
    if labels == []:
        return cifar_files.py2_pickle({"data": data})
    return cifar_files.py2_pickle({"data": data, "fine_labels": list(range(rows)) if labels is None else labels})


DAMAGED = {"build-on-a-dict": b"\x80\x02}q\x00}q\x01b.",  # AttributeError inside the unpickler
           "label-too-big": _batch(2, [])[:-2] + b"U\x0bfine_labels](\x8a\x0d" + (10**30).to_bytes(13, "little")
                            + b"K\x01eu.",  # [10**30, 1] as a LONG1 (OverflowError as int64)
           "negative-label": _batch(2, [])[:-2] + b"U\x0bfine_labels](J\xff\xff\xff\xffK\x01eu.",
           "labels-not-a-list": _batch(2, [[0, 1], [1, 0]])}


@pytest.mark.parametrize("blob", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_file_is_refused_exit_2(tmp_path, blob):
    # Review of issue 19, M8: these escaped the loader as AttributeError, SystemError or OverflowError (exit 1,
    # a traceback); a negative label reached the sampler.
    (tmp_path / "x").write_bytes(blob)
    with pytest.raises(HpcTrainError, match=r"x (is not|is unreadable or not) a CIFAR python batch") as refused:
        datasets._read_cifar_batches(tmp_path, ["x"], "fine_labels")
    assert refused.value.exit_code == 2


def test_every_mutation_of_an_official_batch_loads_or_is_refused_exit_2(tmp_path):
    # 1,500 single-byte mutations of an official-format batch (a fixed seed): each one loads or is refused with
    # exit 2, never an exception of another kind (the review found 30 in 3,000 that escaped).
    import random

    official, rng, escaped = _batch(1), random.Random(19), []
    for trial in range(1500):
        blob = bytearray(official)
        for _ in range(rng.randint(1, 3)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        (tmp_path / "x").write_bytes(bytes(blob))
        try:
            datasets._read_cifar_batches(tmp_path, ["x"], "fine_labels")
        except HpcTrainError as exc:
            assert exc.exit_code == 2
        except Exception as exc:  # noqa: BLE001 (what this test looks for)
            escaped.append(f"{trial}: {exc.__class__.__name__}: {exc}")
    assert not escaped, escaped[:5]


def test_a_file_python_3_re_pickled_says_so(tmp_path):
    import numpy as np

    (tmp_path / "x").write_bytes(pickle.dumps({"data": np.zeros((1, 3072), np.uint8), "fine_labels": [0]}, protocol=2))
    with pytest.raises(HpcTrainError, match="x was re-pickled by Python 3"):
        datasets._read_cifar_batches(tmp_path, ["x"], "fine_labels")
