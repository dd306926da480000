"""Stand-in kernel modules: a minimal ELF64 relocatable file whose only content is a .modinfo section.

That is enough for the real `modinfo` (kmod) to print its version and license, which is how the nvidia_driver role
tells which driver a built module is; nothing can load it. The fake Slurm's reboot reads it back with read_modinfo.
"""

from __future__ import annotations

import struct
from pathlib import Path

# License strings of NVIDIA's two kernel module flavours (MODULE_LICENSE in each source tree).
LICENSE = {"open": "Dual MIT/GPL", "proprietary": "NVIDIA"}


def module_elf(fields: dict[str, str]) -> bytes:
    modinfo = b"".join(f"{key}={value}".encode() + b"\0" for key, value in fields.items())
    shstrtab = b"\0.modinfo\0.shstrtab\0"
    modinfo_offset = 64  # right after the ELF header
    shstrtab_offset = modinfo_offset + len(modinfo)
    sections_offset = (shstrtab_offset + len(shstrtab) + 7) & ~7

    def section(name: int, kind: int, flags: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, flags, 0, offset, size, 0, 0, 1, 0)

    sections = (section(0, 0, 0, 0, 0) + section(1, 1, 2, modinfo_offset, len(modinfo))  # SHT_PROGBITS, SHF_ALLOC
                + section(10, 3, 0, shstrtab_offset, len(shstrtab)))  # SHT_STRTAB
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little endian, current version
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, sections_offset, 0, 64, 0, 0, 64, 3, 2)  # ET_REL, x86-64
    body = header + modinfo + shstrtab
    return body + bytes(sections_offset - len(body)) + sections


def nvidia_module(version: str, flavor: str) -> bytes:
    return module_elf({"version": version, "license": LICENSE[flavor], "name": "nvidia",
                       "description": "NVIDIA kernel module (hpc-train test stand-in)"})


def read_modinfo(path: Path) -> dict[str, str]:
    """The key=value strings of a stand-in module (they are the only NUL-separated strings in it)."""
    fields = {}
    for chunk in path.read_bytes().split(b"\0"):
        key, sep, value = chunk.partition(b"=")
        if sep and key.isalpha():
            fields.setdefault(key.decode(), value.decode())
    return fields
