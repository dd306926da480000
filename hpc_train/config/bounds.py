"""Single-field bounds, declared beside their fields (``nodes: int = bounded(1, low=1, high=MAX_NODES)``) and
checked in one place for every section (:func:`check`, the first thing :func:`~.validate.validate` does).
Rules between fields stay in :mod:`.validate`. Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

MAX_NODES = 100_000
MAX_RANKS_PER_NODE = 1024
MAX_PACK = 64
"""Sweep points in one allocation: more is a typo, not a plan (a GPU time-slices beyond a few)."""


@dataclass(frozen=True)
class Bounds:
    """``low``/``high`` (None: no bound), excluded when ``*_open``; ``says`` words the rule where the numbers
    alone would say it badly; ``hint`` follows the value (what to do)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    says: str = ""
    hint: str = ""

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def rule(self, integer: bool) -> str:
        if self.says:
            return self.says
        if self.low is not None and self.high is not None:
            if self.low_open or self.high_open:
                return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
            return f"between {_num(self.low)} and {_num(self.high)}"
        if self.low is not None:
            if self.low_open:
                return f"> {_num(self.low)}"
            return f"at least {_num(self.low)}" if integer else f">= {_num(self.low)}"
        return f"at most {_num(self.high)}" if integer else f"<= {_num(self.high)}"


def _num(x: float) -> str:
    if not float(x).is_integer():
        return f"{x:g}"
    return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))  # 100,000 reads better; 1024 is a number people know


def bounded(default: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False,
            high_open: bool = False, says: str = "", hint: str = "") -> Any:
    """A dataclass field with ``default`` and these bounds (None values are unset, never out of bounds)."""
    return dataclasses.field(default=default, metadata={"bounds": Bounds(low, high, low_open, high_open, says, hint)})


def check(section: Any, path: str) -> None:
    """Every bounded field of ``section`` and of the sections inside it; the first value out of its bounds is
    a ConfigError naming the dotted key (``slurm.nodes must be between 1 and 100,000, got 0``)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        key = f"{path}.{f.name}" if path else f.name
        bounds: Bounds | None = f.metadata.get("bounds")
        if bounds is not None and value is not None and not (isinstance(value, float) and math.isnan(value)):
            if not bounds.holds(value):
                unset = " (or unset)" if f.default is None else ""
                hint = f"; {bounds.hint}" if bounds.hint else ""
                raise ConfigError(f"{key} must be {bounds.rule(isinstance(value, int))}{unset}, got {value}{hint}")
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check(value, key)
