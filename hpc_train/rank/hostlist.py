"""Slurm node-list expansion (``gpu[01-03,07],cpu-a[1-2]`` → names), pure Python.

The batch shell uses ``scontrol show hostnames`` (the source of truth); this is the fallback for tasks
that run without scontrol (containers) and the engine of ``hpc-train simulate``.
"""

from __future__ import annotations

import re

from ..errors import ConfigError

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"node list {text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"node list {text!r}: unbalanced '['")
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _expand_range(spec: str, whole: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        m = _RANGE_RE.match(item.strip())
        if not m:
            raise ConfigError(f"node list {whole!r}: bad range {item!r} inside brackets")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ConfigError(f"node list {whole!r}: range {item!r} runs backwards")
        width = len(lo)  # Slurm keeps the zero padding of the lower bound
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_name(name: str, whole: str) -> list[str]:
    """Expand every bracket group of one name (``rack[1-2]-n[01-02]`` → 4 names, outer group first)."""
    m = re.search(r"\[([^\[\]]*)\]", name)
    if not m:
        return [name]
    prefix, suffix = name[: m.start()], name[m.end() :]
    return [
        expanded
        for value in _expand_range(m.group(1), whole)
        for expanded in _expand_name(prefix + value + suffix, whole)
    ]


def _range_size(spec: str, whole: str) -> int:
    total = 0
    for item in spec.split(","):
        m = _RANGE_RE.match(item.strip())
        if not m:
            raise ConfigError(f"node list {whole!r}: bad range {item!r} inside brackets")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ConfigError(f"node list {whole!r}: range {item!r} runs backwards")
        total += hi - lo + 1
    return total


def _parts(nodelist: str) -> list[str]:
    if not nodelist or not nodelist.strip():
        raise ConfigError("node list is empty; give one like 'gpu[01-04]'")
    return _split_top_level(nodelist)


def count(nodelist: str) -> int:
    """How many hosts a node list names, without expanding it (``gpu[1-99999999]`` is one multiplication)."""
    total = 0
    for part in _parts(nodelist):
        size = 1
        for group in re.findall(r"\[([^\[\]]*)\]", part):
            size *= _range_size(group, nodelist)
        total += size
    return total


def expand(nodelist: str, *, max_hosts: int | None = None) -> list[str]:
    """All host names of a Slurm node list, in Slurm's order; more than ``max_hosts`` is refused before
    any name is made."""
    parts = _parts(nodelist)
    if max_hosts is not None and (hosts := count(nodelist)) > max_hosts:
        raise ConfigError(f"node list {nodelist!r} names {hosts:,} hosts; at most {max_hosts:,} here")
    return [host for part in parts for host in _expand_name(part, nodelist)]


def expand_tasks_per_node(value: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` / ``SLURM_STEP_TASKS_PER_NODE`` form: ``2(x3),1`` → [2, 2, 2, 1]."""
    out: list[int] = []
    for item in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ConfigError(f"tasks-per-node value {value!r} is not in Slurm's form (e.g. '8(x4)')")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out
