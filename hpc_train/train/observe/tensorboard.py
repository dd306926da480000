"""TensorBoard event files with the scalars of metrics.jsonl (``train.tensorboard: true``).

Every evaluation record the trainer appends to ``metrics.jsonl`` goes through :func:`write_metrics`; with
TensorBoard on, its numbers are also written as scalars (``test/top1``, ``test/many``, ``val/balanced``,
``posthoc/top1``, ...) at the record's ``global_step``, to ``<run dir>/tensorboard/events.out.tfevents.*``
(point ``tensorboard --logdir runs/NAME`` at a job's runs). The event file format — TFRecord framing
(length, masked CRC-32C of it, the bytes, masked CRC-32C of them) around ``Event`` protocol buffers — is
written here directly, so the compute nodes need neither TensorBoard nor protobuf installed.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from ...runs import rundir
from .metrics import append_jsonl

EVENTS_DIR = "tensorboard"
_SKIPPED = ("epoch", "global_step", "per_class", "correct", "count", "val_balanced")


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire_type)
    return key + (_varint(len(payload)) + payload if wire_type == 2 else payload)


def event(wall_time: float, *, step: int = 0, file_version: str | None = None,
          scalars: Mapping[str, float] | None = None) -> bytes:
    """One serialized ``Event``: wall_time (1), step (2), file_version (3) or summary (5) of simple values."""
    out = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        out += _field(3, 2, file_version.encode())
    if scalars:
        values = b"".join(_field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
                          for tag, value in scalars.items())
        out += _field(5, 2, values)
    return out


def record(data: bytes) -> bytes:
    """TFRecord framing of one event."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


def scalars_of(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The numbers of a metrics.jsonl record as ``split/name`` tags (nested sections flattened)."""
    split = metrics.get("split", "test") if not prefix else prefix
    for key, value in metrics.items():
        if key in _SKIPPED or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            yield f"{split}/{key}", float(value)
        elif isinstance(value, Mapping):
            yield from scalars_of(value, key)


class EventWriter:
    """One event file per process (TensorBoard reads every file of the directory; a resumed run adds one)."""

    def __init__(self, run_dir: Path) -> None:
        directory = run_dir / EVENTS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self._write(event(time.time(), file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        with open(self.path, "ab") as handle:
            handle.write(record(data))
            handle.flush()
            os.fsync(handle.fileno())

    def add(self, metrics: Mapping[str, Any]) -> None:
        scalars = dict(scalars_of(metrics))
        if scalars:
            self._write(event(time.time(), step=int(metrics.get("global_step", 0)), scalars=scalars))


_writers: dict[Path, EventWriter] = {}


def write_metrics(run_dir: Path, metrics: dict[str, Any], tensorboard: bool) -> None:
    """Append one evaluation record to metrics.jsonl and, with ``train.tensorboard``, to the event file."""
    append_jsonl(run_dir / rundir.METRICS, metrics)
    if tensorboard:
        if run_dir not in _writers:
            _writers[run_dir] = EventWriter(run_dir)
        _writers[run_dir].add(metrics)
