"""Reading and writing the files of a run directory that others may share (issue 28, item 4): the one way
hpc-train touches ``state.jsonl``, ``run.json``, ``metrics.jsonl``, the logs and the run index.

A shared runs directory may hold what another user planted: a symlink where ``state.jsonl`` should be (an append
would go through it into any file the user can write), a FIFO or a device (a read would block or never end), a
``run.json`` whose ``logs.batch`` names ``/etc/shadow``. So, here:

* every write or append opens with ``O_NOFOLLOW`` and refuses a directory on the way that is a symlink (within
  the directory it is written in: the run directory, the index's state directory), and only appends to a regular
  file;
* every read opens with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO opens at once, a symlink is refused), checks with
  ``fstat`` that it is a regular file, and reads at most a bound (a file larger is refused, never read whole);
* a path a run record names (its logs) is used only inside the run's own job directory (:func:`confined`).

A refusal is an :class:`RunFileError` (exit 2) naming the file and what it is; ``status`` shows the run it
belongs to as ``unknown`` with that reason, and the other runs as usual. Torch-free, stdlib only.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..errors import HpcTrainError

RECORD_MAX_BYTES = 1 << 20
"""run.json, config.json, summary.json, a heartbeat: hpc-train writes them in kilobytes."""
LOG_MAX_BYTES = 256 << 20
"""state.jsonl, metrics.jsonl, the run index: one line per event, epoch or run (a year of daily runs is < 1 MiB)."""
CHUNK_BYTES = 1 << 20
"""What ``logs`` reads from a log at a time (a log is streamed, never read whole)."""


class RunFileError(HpcTrainError):
    """A file of a run directory is not what hpc-train wrote there: a symlink, a FIFO, a device, a directory, a
    file larger than its bound, a recorded path outside the run's directory, or a record whose values have the
    wrong types (exit 2)."""


NUMBER = (int, float)
"""A record schema's number."""


def wrong_type(record: Mapping[str, Any], schema: Mapping[str, tuple[type, ...]]) -> str:
    """What in a record has a type its readers do not expect, by ``schema`` (field: the types it is read as), or ""
    when nothing has. A field left out or null is not wrong; a bool is never a number (JSON's ``true`` is not 1).
    The one type check of what hpc-train reads back: run records, state lines, metrics lines."""
    for key, types in schema.items():
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            return f"{key} is {type(value).__name__} {value!r:.40}, not {'/'.join(t.__name__ for t in types)}"
    return ""


def check_types(record: Mapping[str, Any], schema: Mapping[str, tuple[type, ...]], where: str) -> None:
    """:func:`wrong_type` as a :class:`RunFileError` naming ``where`` (the run is then ``unknown``, with it)."""
    problem = wrong_type(record, schema)
    if problem:
        raise RunFileError(f"{where}: {problem}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse_symlink(path: Path, exc: OSError) -> None:
    """Re-raise an ``O_NOFOLLOW`` refusal as what it is (ELOOP: the last component is a symlink)."""
    if exc.errno == errno.ELOOP:
        raise RunFileError(f"{path} is a symlink; hpc-train neither reads nor writes a run's files through one "
                              "(remove it)") from None
    raise exc


def check_parents(path: Path, within: Path | None) -> None:
    """No directory below ``within`` on the way to ``path`` is a symlink: a planted ``logs -> /elsewhere`` would
    take every log write elsewhere."""
    if within is None:
        return
    try:
        relative = Path(path).relative_to(within)
    except ValueError:
        raise RunFileError(f"{path} is outside {within}") from None
    current = Path(within)
    for part in relative.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise RunFileError(f"{current} is a symlink; hpc-train writes a run's files only in its own "
                                  "directories (remove it)")


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor of ``path``, opened without following a symlink or blocking, and only if a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        _refuse_symlink(path, exc)
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise RunFileError(f"{path} is {_kind(mode)}, not a regular file; hpc-train reads and writes only "
                              "regular files in a run directory")
    return fd


def read_bytes(path: Path, limit_bytes: int = RECORD_MAX_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit_bytes`` (FileNotFoundError when there is none)."""
    fd = _open_regular(Path(path), os.O_RDONLY)
    try:
        if os.fstat(fd).st_size > limit_bytes:
            raise RunFileError(f"{path} is larger than {limit_bytes >> 20} MiB; hpc-train does not read it")
        data = os.read(fd, limit_bytes + 1)
        chunks = [data]
        while data and sum(map(len, chunks)) <= limit_bytes:  # a file that grew since fstat: read on, bounded
            data = os.read(fd, limit_bytes + 1 - sum(map(len, chunks)))
            chunks.append(data)
    finally:
        os.close(fd)
    whole = b"".join(chunks)
    if len(whole) > limit_bytes:
        raise RunFileError(f"{path} is larger than {limit_bytes >> 20} MiB; hpc-train does not read it")
    return whole


def read_text(path: Path, limit_bytes: int = RECORD_MAX_BYTES, errors: str = "strict") -> str:
    return read_bytes(path, limit_bytes).decode("utf-8", errors=errors)


def read_json(path: Path, limit_bytes: int = RECORD_MAX_BYTES) -> Any:
    """A JSON file's value (ValueError when it is not JSON or not UTF-8)."""
    return json.loads(read_text(path, limit_bytes))


def read_chunk(path: Path, offset: int, limit_bytes: int = CHUNK_BYTES) -> tuple[bytes, int]:
    """At most ``limit_bytes`` of a regular file from ``offset``, and the offset after them (``logs``, ``-f``)."""
    fd = _open_regular(Path(path), os.O_RDONLY)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, limit_bytes)
    finally:
        os.close(fd)
    return data, offset + len(data)


def open_append(path: Path, within: Path | None = None) -> int:
    """A descriptor appending to the regular file ``path`` (created when missing), never through a symlink, and
    with no symlinked directory between ``within`` and it. The caller closes it."""
    check_parents(Path(path), within)
    fd = _open_regular(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.set_blocking(fd, True)
    return fd


def append_bytes(path: Path, data: bytes, within: Path | None = None) -> None:
    """One write with ``O_APPEND``: concurrent writers of one short line each never interleave. A short write (a
    full disk) is an OSError naming its reason, never a torn line taken for written."""
    fd = open_append(path, within)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (wrote {written} of {len(data)} bytes)",
                          str(path))
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str, within: Path | None = None) -> None:
    """Write a file whole or not at all: a temporary file in the same directory, then a rename (which replaces a
    symlink planted at ``path`` itself, never its target)."""
    path = Path(path)
    check_parents(path, within)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def confined(recorded: str | os.PathLike[str], root: Path, what: str) -> Path:
    """``recorded`` (a path a run record names) when it lies under ``root``, after resolving ``..`` and symlinks;
    else an RunFileError naming ``what``: ``logs.batch: /etc/shadow`` in a shared run.json never makes
    ``hpc-train logs`` print that file."""
    path = Path(recorded)
    if not path.is_absolute():
        path = root / path
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    if real != real_root and real_root not in real.parents:
        raise RunFileError(f"{what} {recorded} is outside the run's directory {root}; hpc-train reads only "
                              "files under it")
    return path
