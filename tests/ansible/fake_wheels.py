"""Stand-in wheels for the pytorch_env test: torch/torchvision in +cu128, +cpu and plain builds, their NCCL
dependency, and an hpc-train whose "train" extra requires torch. Tiny pure-Python wheels; only their names, versions,
tags and metadata matter. The tags are the real ones: torch 2.7 is manylinux_2_28, nvidia-nccl-cu12 2.26.2 is
manylinux2014/manylinux_2_17, which is what the offline recipe in docs/ansible.md must cope with.

    python fake_wheels.py DIR [--no-cuda-build]      wheels in DIR;  index(DIR, INDEX_DIR): a PEP 503 simple index
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import sys
import zipfile
from pathlib import Path

TORCH_TAG = "cp311-cp311-manylinux_2_28_x86_64"
NCCL_TAG = "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"
NCCL_VERSION = "2.26.2"  # torch 2.7.1's pin


def write_wheel(directory: Path, name: str, version: str, requires: list[str] = (), extras: list[str] = (),
                tag: str = "py3-none-any") -> Path:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
            + [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
        ) + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hpc-train-tests\nRoot-Is-Purelib: true\n"
                         + "".join(f"Tag: {t}\n" for t in expand(tag)),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def expand(tag: str) -> list[str]:
    """'py3-none-a.b' -> ['py3-none-a', 'py3-none-b'] (a compressed tag set)."""
    python, abi, platforms = tag.split("-")
    return [f"{python}-{abi}-{platform}" for platform in platforms.split(".")]


def build(directory: Path, with_cuda_build: bool = True) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    local_tags = ["+cpu", ""] + (["+cu128"] if with_cuda_build else [])
    nccl = f"nvidia-nccl-cu12=={NCCL_VERSION}"
    wheels = [write_wheel(directory, "torch", "2.7.1" + local, requires=[nccl] if local == "+cu128" else [], tag=TORCH_TAG)
              for local in local_tags]
    wheels += [write_wheel(directory, "torchvision", "0.22.1" + local, requires=["torch"], tag=TORCH_TAG) for local in local_tags]
    wheels.append(write_wheel(directory, "nvidia-nccl-cu12", NCCL_VERSION, tag=NCCL_TAG))
    wheels.append(write_wheel(directory, "hpc-train", "0.1.0", requires=['torch; extra == "train"'], extras=["train"]))
    return wheels


def index(wheels: Path, index_dir: Path) -> Path:
    """A PEP 503 simple index of the wheels (index.html per project), usable as file:// or over HTTP."""
    simple = index_dir / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        projects.setdefault(re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower(), []).append(wheel)
    for project, files in projects.items():
        (simple / project).mkdir(parents=True)
        for wheel in files:
            shutil.copy2(wheel, simple / project / wheel.name)
        links = "".join(f'<a href="{w.name}">{w.name}</a><br>\n' for w in files)
        (simple / project / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    links = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in projects)
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return simple


if __name__ == "__main__":
    for built in build(Path(sys.argv[1]), with_cuda_build=sys.argv[2:] != ["--no-cuda-build"]):
        print(built.name)
