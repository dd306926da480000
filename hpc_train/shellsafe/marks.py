"""Job values marked in a rendered script: where each one starts and ends, and whether a quoting filter made it.

The Jinja finalizer (:mod:`hpc_train.render`) wraps every ``{{ ... }}`` it emits in a mark carrying the value's
number; :func:`unmark` takes the marks out again and returns the script as it will be written, with the
:class:`Region` of every value in it. Marks are built from NUL bytes, which no job value can hold (the job
reader refuses them, and no path or command-line argument can carry one), so a value cannot forge a mark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RAW = "raw"
"""A value that no quoting filter made: it must be inert where it lands as it is."""
QUOTED = "quoted"
"""The output of a quoting filter (``shquote``, ``sbatch``, ``comment``, a ``join`` of quoted words): its own
quotes are part of it, but it must still land where those quotes mean what they say."""

_KINDS = {"r": RAW, "q": QUOTED}
_MARK = re.compile("\x00(?:S([rq])(\\d+)\x00|E\x00)")


@dataclass(frozen=True)
class Origin:
    """Which value a character came from: the value's number (the finalizer's count) and its kind."""

    index: int
    kind: str


@dataclass(frozen=True)
class Region:
    start: int
    end: int
    origin: Origin


class Malformed(Exception):
    """The marks do not nest (a filter changed a marked text): the script cannot be checked."""


def mark(text: str, kind: str, index: int) -> str:
    return f"\x00S{kind[0]}{index}\x00{text}\x00E\x00"


def is_marked(text: str) -> bool:
    return "\x00" in text


def unmark(marked: str) -> tuple[str, list[Region]]:
    """The script without marks, and the regions of the values in it. A value inside another value (a macro's
    output quoted by a filter) belongs to the outer one: its quoting is what decides."""
    out: list[str] = []
    regions: list[Region] = []
    open_marks: list[tuple[Origin, int]] = []
    length = last = 0
    for m in _MARK.finditer(marked):
        chunk = marked[last:m.start()]
        if "\x00" in chunk:
            raise Malformed("a NUL byte outside a mark")
        out.append(chunk)
        length += len(chunk)
        last = m.end()
        if m.group(1):
            open_marks.append((Origin(int(m.group(2)), _KINDS[m.group(1)]), length))
            continue
        if not open_marks:
            raise Malformed("a mark closes that was never opened")
        origin, start = open_marks.pop()
        if not open_marks and length > start:
            regions.append(Region(start, length, origin))
    tail = marked[last:]
    if open_marks or "\x00" in tail:
        raise Malformed("a mark is not closed")
    out.append(tail)
    return "".join(out), regions
