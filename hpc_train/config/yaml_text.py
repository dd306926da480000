"""Job, site and sweep files read as data, the way they were written.

PyYAML resolves plain scalars by YAML 1.1 rules (``010`` → 8, ``0x10`` → 16, ``on`` → True, ``1_000`` →
1000, ``1:30:00`` → 5400); YAML 1.2 still reads ``0x10`` as 16, and PyYAML has no 1.2 mode anyway. No
YAML schema alone can give a text field exactly the text that was written, so this module resolves
nothing: it composes a document into dicts, lists and :class:`Scalar` (the text as written, and whether
it was quoted), and :mod:`hpc_train.config.typed` turns each scalar into the type its field declares.

It also refuses what a job file should never hold: duplicate keys (a second ``slurm:`` block would
silently replace the first), tags (``!!python/...``), non-text keys, and NUL bytes; and it reads only
regular files under a size cap (``render /dev/zero`` must not read until the OOM killer acts).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

MAX_FILE_BYTES = 1 << 20
"""Job, site and sweep files are small; anything larger is not one (1 MiB)."""

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


@dataclass(frozen=True)
class Scalar:
    """A YAML scalar as written: ``text`` is the value after YAML's own quoting and escapes, ``quoted`` says
    whether it was written in quotes (a quoted ``'8'`` is text, a plain ``8`` may be a number)."""

    text: str
    quoted: bool = False
    where: str = ""
    """``file:line:column`` (for messages)."""

    def __repr__(self) -> str:
        return repr(self.text)


class _Composer(yaml.SafeLoader):
    """SafeLoader that resolves no plain scalar: every one is composed with the ``str`` tag."""


_Composer.yaml_implicit_resolvers = {}


def _where(source: str, node: yaml.Node) -> str:
    mark = node.start_mark
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _raw(node: yaml.Node, source: str) -> Any:
    """A composed node as dicts, lists and Scalars (YAML 1.1 merge keys ``<<`` applied)."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag != _STR_TAG:
            raise ConfigError(f"{_where(source, node)}: YAML tags ({node.tag.rsplit(':', 1)[-1]}) are not read; "
                              "write the value plainly")
        if "\0" in node.value:
            raise ConfigError(f"{_where(source, node)}: a value contains a NUL byte; remove it")
        return Scalar(node.value, quoted=node.style in ("'", '"', "|", ">"), where=_where(source, node))
    if isinstance(node, yaml.SequenceNode):
        if node.tag != _SEQ_TAG:
            raise ConfigError(f"{_where(source, node)}: YAML tags are not read; write the list plainly")
        return [_raw(item, source) for item in node.value]
    if node.tag != _MAP_TAG:
        raise ConfigError(f"{_where(source, node)}: YAML tags are not read; write the mapping plainly")
    out: dict[str, Any] = {}
    first_seen: dict[str, str] = {}
    merged: dict[str, Any] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
            raise ConfigError(f"{_where(source, key_node)}: a key must be plain text")
        key = key_node.value
        if key == "<<" and not key_node.style:  # YAML 1.1 merge key: `<<: *defaults`
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for merged_node in sources:
                part = _raw(merged_node, source)
                if not isinstance(part, dict):
                    raise ConfigError(f"{_where(source, merged_node)}: '<<' merges mappings only")
                merged = {**part, **merged}
            continue
        if key in first_seen:
            raise ConfigError(f"{_where(source, key_node)}: duplicate key {key!r} (first at {first_seen[key]}); "
                              "write each key once")
        first_seen[key] = _where(source, key_node)
        out[key] = _raw(value_node, source)
    return {**merged, **out}


def parse_yaml(text: str, source: str) -> Any:
    """A YAML document as raw data (dicts, lists, :class:`Scalar`); None for an empty document.
    Syntax errors name ``source:line:column``."""
    if "\0" in text:
        raise ConfigError(f"{source}: contains a NUL byte; a job file is text")
    loader = _Composer(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    finally:
        loader.dispose()
    return None if node is None else _raw(node, source)


def parse_mapping(text: str, source: str, what: str = "job file") -> dict[str, Any]:
    """A YAML document that must be a mapping (job, site and sweep files)."""
    try:
        data = parse_yaml(text, source)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; fix the {what}" if "YAML syntax error" in str(exc) else str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else "a single value"
        raise ConfigError(f"{source}: a {what} must be a YAML mapping (key: value), got {kind}")
    return data


def parse_value(text: str, source: str) -> Any:
    """One value typed on the command line (``--set key=VALUE``, a ``--sweep`` value): YAML flow syntax
    (``[a, b]``, ``{k: v}``, quotes) is read; text that is not valid YAML is taken as it is."""
    if not text.strip():
        return Scalar("", where=source)
    try:
        data = parse_yaml(text, source)
    except ConfigError:
        if "\0" in text:
            raise
        return Scalar(text, quoted=True, where=source)
    return Scalar("", where=source) if data is None else data


def read_text_file(path: Path, what: str = "job file", max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a small regular file; anything else (missing, a directory, a device or FIFO, too large,
    not UTF-8) is a ConfigError naming the file."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ConfigError(f"{what} {path} is {kind}; give a YAML file")
    if info.st_size > max_bytes:
        raise ConfigError(f"{what} {path} is {info.st_size} bytes; a {what} is at most {max_bytes // 1024} KiB")
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)  # a file that grows (or lies about its size) is still capped
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} {path} is larger than {max_bytes // 1024} KiB; a {what} is small")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {what} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_yaml_file(path: Path, what: str = "job file") -> dict[str, Any]:
    """A job, site or sweep file as a raw mapping (see :func:`parse_mapping`)."""
    return parse_mapping(read_text_file(path, what), str(path), what)
