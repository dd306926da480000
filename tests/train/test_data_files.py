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
