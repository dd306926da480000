"""Job values never execute: where each value of a rendered script lands, as bash reads it, and whether a
shell would expand, parse or run it there (docs/design.md, decision 3).

:func:`read` takes a script whose values are marked (:mod:`.marks`), reads it (:mod:`.lexer`, :mod:`.reader`)
and judges every character of every value, and every command values end up in (:mod:`.rules`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .lexer import Lexer
from .marks import QUOTED, RAW, Malformed, Origin, Region, is_marked, mark, unmark
from .reader import Unreadable
from .rules import Unsafe

__all__ = ["QUOTED", "RAW", "Finding", "Malformed", "Origin", "Reading", "Region", "Unreadable", "Unsafe", "is_marked",
           "mark", "read", "unmark"]


@dataclass(frozen=True)
class Finding:
    """A value that lands where a shell would not leave it alone: which one, its text, and how it lands."""

    origin: Origin | None
    value: str
    where: str


@dataclass(frozen=True)
class Reading:
    finding: Finding | None
    """The first value of the script that is not inert where it lands (None: every one is)."""
    programs: frozenset[str] = frozenset()
    """The programs the script's commands run (``srun``, ...)."""


def read(text: str, regions: list[Region]) -> Reading:
    """``text`` (unmarked, with its values' ``regions``) as bash reads it."""
    lexer = Lexer(text, regions)
    try:
        lexer.run()
    except Unsafe as exc:
        region = next((r for r in regions if r.origin.index == exc.origin.index), None)
        return Reading(Finding(exc.origin, text[region.start:region.end] if region else "", exc.where))
    except Unreadable as exc:
        return Reading(Finding(None, "", f"the script cannot be read as shell ({exc})"))
    except RecursionError:
        return Reading(Finding(None, "", "the script cannot be read as shell (its expansions nest too deep)"))
    return Reading(None, frozenset(lexer.programs))
