"""Helpers shared by the ansible test ladder (ladder.py): fake machine trees and result records."""

from __future__ import annotations

import json
import os
from pathlib import Path

SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def build_fixture_machine(fixture: dict, machine_dir: Path) -> None:
    """Create <machine_dir>/root (empty system root) and the fixture's fake /sys: PCI functions and EFI vars.

    PCI functions are laid out like the real sysfs: /sys/bus/pci/devices/<addr> is a symlink into
    /sys/devices/pci0000:00/<addr>, which holds the 'vendor' and 'class' files.
    """
    (machine_dir / "root" / "etc").mkdir(parents=True, exist_ok=True)
    sys_dir = machine_dir / "sys"
    bus_dir = sys_dir / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    for index, (vendor, pci_class) in enumerate(fixture["pci_devices"]):
        address = f"0000:{0x17 + index:02x}:00.0"
        device_dir = sys_dir / "devices" / "pci0000:00" / address
        device_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "vendor").write_text(vendor + "\n")
        (device_dir / "class").write_text(pci_class + "\n")
        link = bus_dir / address
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(device_dir, bus_dir))
    efivars = sys_dir / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True, exist_ok=True)
    # 4 attribute bytes (NV+BS+RT) and the value byte.
    (efivars / SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00" + (b"\x01" if fixture["secure_boot"] else b"\x00"))


def read_records(path: Path) -> list[dict]:
    """Records written by callback_plugins/record_results.py, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def file_afters(records: list[dict], host: str, sysroot: str) -> dict[str, str]:
    """Path (relative to the host's sysroot) -> the 'after' text of the last diff that wrote it."""
    afters: dict[str, str] = {}
    for record in records:
        if record["host"] != host:
            continue
        diffs = list(record["diff"]) + [d for item in record["results"] for d in (item["diff"] if isinstance(item["diff"], list) else [item["diff"]])]
        for diff in diffs:
            if not isinstance(diff, dict) or "after" not in diff:
                continue
            # template: before_header is the destination (after_header is a temp file); blockinfile: "<path> (content)".
            headers = [diff.get("before_header") or "", diff.get("after_header") or ""]
            header = next((h for h in headers + [record.get("dest", "")] if h.startswith(sysroot)), headers[0] or headers[1])
            header = header.removesuffix(" (content)")
            if header.startswith(sysroot):
                header = header[len(sysroot):]
            afters[header] = diff["after"] if isinstance(diff["after"], str) else json.dumps(diff["after"])
    return afters


def host_facts(records: list[dict], host: str) -> dict:
    """All facts set for the host by set_fact and modules, later ones winning."""
    facts: dict = {}
    for record in records:
        if record["host"] == host and record["status"] == "ok":
            facts.update(record["facts"])
    return facts


def first_failure(records: list[dict], host: str) -> dict | None:
    """The failure that stopped the host: the last failed result (earlier ones may have been rescued)."""
    return next((r for r in reversed(records) if r["host"] == host and r["status"] in ("failed", "unreachable")), None)
