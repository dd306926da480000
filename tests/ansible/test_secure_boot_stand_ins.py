"""The Secure Boot stand-ins fail where the real parts fail, by real cryptography (fake_secure_boot/secure_boot.py):
a module signed by the kernel's real sign-file loads under Secure Boot only with its signer's certificate enrolled;
another key, no signature, or one byte changed after signing is refused; with Secure Boot off anything loads. The real
modinfo (kmod) reads the signer sign-file wrote. Needs Debian's linux-kbuild-6.1 (run.sh installs it): missing, it fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fake_repos import kmod_elf
from fake_secure_boot import secure_boot


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("keys")
    return {name: secure_boot.make_key_pair(directory, name) for name in ("site", "stranger")}


def signed_module(directory: Path, key_pair: tuple[Path, Path]) -> Path:
    module = directory / "nvidia.ko"
    module.write_bytes(kmod_elf.nvidia_module("570.172.08", "open"))
    subprocess.run([str(secure_boot.SIGN_FILE), "sha512", str(key_pair[0]), str(key_pair[1]), str(module)], check=True)
    return module


def test_signed_by_an_enrolled_key_loads_and_modinfo_reads_its_signer(tmp_path: Path, keys: dict) -> None:
    module = signed_module(tmp_path, keys["site"])
    secure_boot.set_mok_state(tmp_path, True, enrolled=[keys["stranger"][1], keys["site"][1]])
    assert secure_boot.module_loads(module, tmp_path)
    signer = subprocess.run(["modinfo", "-F", "signer", str(module)], capture_output=True, text=True, check=True).stdout
    assert signer.strip() == "site module signing key"


def test_signed_by_a_key_that_is_not_enrolled_is_refused(tmp_path: Path, keys: dict) -> None:
    module = signed_module(tmp_path, keys["stranger"])
    secure_boot.set_mok_state(tmp_path, True, enrolled=[keys["site"][1]], pending=[keys["stranger"][1]])
    assert not secure_boot.module_loads(module, tmp_path)  # a pending enrolment is not an enrolment


def test_unsigned_or_altered_module_is_refused_and_anything_loads_without_secure_boot(tmp_path: Path, keys: dict) -> None:
    module = signed_module(tmp_path, keys["site"])
    altered = tmp_path / "altered.ko"
    body = bytearray(module.read_bytes())
    body[70] ^= 1  # inside .modinfo, which the signature covers
    altered.write_bytes(bytes(body))
    unsigned = tmp_path / "unsigned.ko"
    unsigned.write_bytes(kmod_elf.nvidia_module("570.172.08", "open"))
    secure_boot.set_mok_state(tmp_path, True, enrolled=[keys["site"][1]])
    assert not secure_boot.module_loads(altered, tmp_path)
    assert not secure_boot.module_loads(unsigned, tmp_path)
    secure_boot.set_mok_state(tmp_path, False)
    assert secure_boot.module_loads(unsigned, tmp_path)
