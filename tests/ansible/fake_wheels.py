"""Stand-in wheels for the pytorch_env test: torch/torchvision in +cu128, +cpu and plain builds, and an hpc-train
whose "train" extra requires torch. Tiny pure-Python wheels; only their names, versions and metadata matter."""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def write_wheel(directory: Path, name: str, version: str, requires: list[str] = (), extras: list[str] = ()) -> Path:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
            + [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
        ) + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hpc-train-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def build(directory: Path, with_cuda_build: bool = True) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    local_tags = ["+cpu", ""] + (["+cu128"] if with_cuda_build else [])
    wheels = [write_wheel(directory, "torch", "2.7.1" + tag) for tag in local_tags]
    wheels += [write_wheel(directory, "torchvision", "0.22.1" + tag, requires=["torch"]) for tag in local_tags]
    wheels.append(write_wheel(directory, "hpc-train", "0.1.0", requires=['torch; extra == "train"'], extras=["train"]))
    return wheels


if __name__ == "__main__":
    for wheel in build(Path(sys.argv[1]), with_cuda_build=sys.argv[2:] != ["--no-cuda-build"]):
        print(wheel.name)
