"""The nvidia_cuda_context module (ansible/roles/nvidia_driver/library/) run as Ansible runs a module, against the
stand-in libcuda of fake_gpu/libcuda_elf.py (a real shared object the dynamic loader loads, whose cuInit and
cuCtxCreate_v2 return fixed codes). What a real driver answers is for a real node (docs/ansible.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "fake_gpu"))
import libcuda_elf  # noqa: E402

MODULE = HERE.parent.parent / "ansible" / "roles" / "nvidia_driver" / "library" / "nvidia_cuda_context.py"


def run_module(tmp_path: Path, libcuda: str) -> dict:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"libcuda": libcuda}}))
    result = subprocess.run([sys.executable, "-B", str(MODULE), str(args)], capture_output=True, text=True)
    return json.loads(result.stdout)


def test_a_context_on_every_gpu(tmp_path: Path) -> None:
    lib = libcuda_elf.build(tmp_path / "libcuda.so.1", devices=8)
    result = run_module(tmp_path, str(lib))
    assert result["ok"] is True and result["changed"] is False
    assert (result["init"], result["devices"], result["contexts"], result["error"]) == (0, 8, [0] * 8, "")


@pytest.mark.parametrize("init_rc, ctx_rc, contexts", [(802, 0, []), (0, 802, [802] * 4)])
def test_fabric_manager_missing_is_system_not_ready(tmp_path: Path, init_rc: int, ctx_rc: int, contexts: list) -> None:
    lib = libcuda_elf.build(tmp_path / "libcuda.so.1", init_rc=init_rc, ctx_rc=ctx_rc, devices=4)
    result = run_module(tmp_path, str(lib))
    assert result["ok"] is False and result["contexts"] == contexts
    assert result["error"] == "CUDA_ERROR_SYSTEM_NOT_READY (802)"


def test_no_gpu_is_not_ok(tmp_path: Path) -> None:
    result = run_module(tmp_path, str(libcuda_elf.build(tmp_path / "libcuda.so.1", devices=0)))
    assert result["ok"] is False and result["devices"] == 0


def test_no_libcuda_is_data_not_a_failure(tmp_path: Path) -> None:
    result = run_module(tmp_path, str(tmp_path / "absent" / "libcuda.so.1"))
    assert not result.get("failed") and result["library"] is False and result["ok"] is False


@pytest.mark.parametrize("code, name", [(2, "CUDA_ERROR_OUT_OF_MEMORY (2)"), (46, "CUDA_ERROR_DEVICES_UNAVAILABLE (46)")])
def test_gpus_in_use_are_busy_not_broken(tmp_path: Path, code: int, name: str) -> None:
    """A node in service: its GPUs' memory is taken (2) or exclusive-process mode holds them (46)."""
    result = run_module(tmp_path, str(libcuda_elf.build(tmp_path / "libcuda.so.1", ctx_rc=code, devices=2)))
    assert result["ok"] is False and result["busy"] is True and result["error"] == name


def test_fabric_failure_is_not_busy(tmp_path: Path) -> None:
    result = run_module(tmp_path, str(libcuda_elf.build(tmp_path / "libcuda.so.1", ctx_rc=802, devices=2)))
    assert result["busy"] is False
