"""A stand-in libcuda.so.1 for x86-64, written byte by byte (no compiler on the CI machine): a minimal ELF shared
object whose CUDA driver API functions return fixed answers — cuInit's code, N devices, cuCtxCreate_v2's code.

Built to show: a caller that loads libcuda with the dynamic loader (ctypes) and acts on cuInit's and cuCtxCreate's
results, e.g. CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch node whose Fabric Manager does not run.
Cannot show: a real CUDA context, a GPU, anything of the real driver.
"""

from __future__ import annotations

import struct
from pathlib import Path


def _functions(init_rc: int, ctx_rc: int, devices: int) -> dict[str, bytes]:
    """x86-64 System V machine code of each function (arguments in rdi, esi, ...; result in eax)."""
    mov_eax = lambda value: b"\xb8" + struct.pack("<I", value & 0xFFFFFFFF)  # noqa: E731  mov eax, imm32
    ret0 = b"\x31\xc0\xc3"  # xor eax, eax; ret
    return {
        "cuInit": mov_eax(init_rc) + b"\xc3",
        "cuDeviceGetCount": b"\xc7\x07" + struct.pack("<I", devices) + ret0,  # *count = devices
        "cuDeviceGet": b"\x89\x37" + ret0,  # *device = ordinal
        "cuCtxCreate_v2": b"\x48\xc7\x07\x01\x00\x00\x00" + mov_eax(ctx_rc) + b"\xc3",  # *ctx = 1
        "cuCtxDestroy_v2": ret0,
        "cuDriverGetVersion": b"\xc7\x07" + struct.pack("<I", 12080) + ret0,
    }


def build(path: Path, init_rc: int = 0, ctx_rc: int = 0, devices: int = 8) -> Path:
    """Write the library: one PT_LOAD (file offset = address), PT_DYNAMIC, PT_GNU_STACK; .hash, .dynsym, .dynstr."""
    functions = _functions(init_rc, ctx_rc, devices)
    names = list(functions)
    strtab = b"\x00libcuda.so.1\x00" + b"".join(n.encode() + b"\x00" for n in names)
    name_offsets = {n: strtab.index(b"\x00" + n.encode() + b"\x00") + 1 for n in names}
    header_size, phdr_size, phnum = 64, 56, 3
    hash_off = header_size + phdr_size * phnum
    nsyms = len(names) + 1
    # SysV hash table with one bucket: whatever a name hashes to, the loader walks every symbol (bucket[0] -> 1,
    # chain[i] -> i + 1, the last chain entry 0) and compares names.
    hash_table = [1, nsyms, 1] + [0] + [i + 1 if i + 1 < nsyms else 0 for i in range(1, nsyms)]
    hash_bytes = struct.pack(f"<{len(hash_table)}I", *hash_table)
    sym_off = hash_off + len(hash_bytes)
    str_off = sym_off + 24 * nsyms
    code_off = (str_off + len(strtab) + 15) & ~15
    code, addresses = b"", {}
    for name in names:
        addresses[name] = code_off + len(code)
        code += functions[name] + b"\xcc" * (-len(functions[name]) % 16)
    dyn_off = (code_off + len(code) + 7) & ~7
    dynamic = [(4, hash_off), (5, str_off), (6, sym_off), (10, len(strtab)), (11, 24), (14, 1), (0, 0)]
    dyn_bytes = b"".join(struct.pack("<qQ", tag, value) for tag, value in dynamic)
    size = dyn_off + len(dyn_bytes)
    symbols = b"\x00" * 24 + b"".join(
        struct.pack("<IBBHQQ", name_offsets[n], 0x12, 0, 1, addresses[n], len(functions[n])) for n in names)  # GLOBAL FUNC
    elf = bytearray(size)
    elf[0:header_size] = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\x00" * 7, 3, 62, 1, 0,
                                     header_size, 0, 0, header_size, phdr_size, phnum, 64, 0, 0)
    phdrs = [(1, 7, 0, 0, 0, size, size, 0x1000), (2, 6, dyn_off, dyn_off, dyn_off, len(dyn_bytes), len(dyn_bytes), 8),
             (0x6474E551, 6, 0, 0, 0, 0, 0, 16)]
    for i, ph in enumerate(phdrs):
        start = header_size + i * phdr_size
        elf[start:start + phdr_size] = struct.pack("<IIQQQQQQ", *ph)
    for offset, blob in ((hash_off, hash_bytes), (sym_off, symbols), (str_off, strtab), (code_off, code), (dyn_off, dyn_bytes)):
        elf[offset:offset + len(blob)] = blob
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(elf))
    return path
