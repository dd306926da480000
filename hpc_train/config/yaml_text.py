"""Job, site and sweep files read as data, the way they were written.

PyYAML resolves plain scalars by YAML 1.1 rules (``010`` → 8, ``0x10`` → 16, ``on`` → True, ``1_000`` →
1000, ``1:30:00`` → 5400); YAML 1.2 still reads ``0x10`` as 16, and PyYAML has no 1.2 mode anyway. No
YAML schema alone can give a text field exactly the text that was written, so this module resolves
nothing: it composes a document into dicts, lists and :class:`Scalar` (the text as written, and whether
it was quoted), and :mod:`hpc_train.config.typed` turns each scalar into the type its field declares.

It also refuses what a job file should never hold: duplicate keys (a second ``slurm:`` block would
silently replace the first), tags (``!!python/...``), non-text keys, and NUL bytes; and it reads only
regular files under a size cap (``render /dev/zero`` must not read until the OOM killer acts). Small but
expensive YAML is refused before it costs anything: nesting deeper than :data:`MAX_DEPTH` (10,000 ``[`` would
exhaust Python's recursion), and more than :data:`MAX_NODES` values once aliases are expanded (a 600-byte
"billion laughs" of nested ``&a``/``*a`` lists expands to billions), or an alias that refers to itself.
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

MAX_DEPTH = 100
"""Mappings and lists nest at most this deep (a job file nests 4 levels: the document's mapping is one)."""
MAX_NODES = 10_000
"""A job, site file or ``--set`` value holds at most this many values (keys, scalars, lists, mappings), aliases
expanded (a resolved job holds about 200)."""
MAX_SWEEP_NODES = 50_000
"""A sweep file's cap: 1,000 points (sweep.MAX_POINTS) of up to 24 keys each."""

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


class YamlTooLarge(ConfigError):
    """Small but expensive YAML: too deep, too many values once aliases are expanded, or an alias in itself."""


class NotText(ConfigError):
    """Input that is not text a job file can hold: a NUL byte, a control character YAML does not allow, a lone
    surrogate (a byte of argv that is not UTF-8); a ``--set`` value that is not YAML is still refused for it."""


def check_text(value: str, where: str) -> str:
    """``value`` is text a job can carry: no NUL byte, and UTF-8 can write it (no lone surrogate, which YAML's
    ``"\\ud800"`` or a non-UTF-8 byte of argv makes, and which every later write would trip over)."""
    if "\0" in value:
        raise NotText(f"{where}: a value contains a NUL byte; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotText(f"{where}: a value holds {_describe(value[exc.start])}; write it as UTF-8 text") from None
    return value


def _describe(ch: str) -> str:
    if 0xDC80 <= ord(ch) <= 0xDCFF:  # how Python hands over a byte of argv that is not UTF-8 (surrogateescape)
        return f"the byte {ord(ch) - 0xDC00:#04x}, which is not UTF-8"
    if 0xD800 <= ord(ch) <= 0xDFFF:
        return f"{ch!r}, a lone surrogate (half of a UTF-16 pair), which is not a character"
    return f"the control character {ch!r}, which YAML does not allow"


class _Composer(yaml.SafeLoader):
    """SafeLoader that resolves no plain scalar (every one is composed with the ``str`` tag) and composes at
    most :data:`MAX_DEPTH` levels (its composer recurses once per level)."""

    def __init__(self, stream: str, source: str, max_nodes: int = MAX_NODES) -> None:
        super().__init__(stream)
        self.source, self.depth, self.max_nodes, self.composed = source, 0, max_nodes, 0

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner reads ahead up to 1,024 characters of ``[[[...`` (each one may start a simple key) before
        # the composer sees the first: stop at the level the composer would refuse.
        if self.flow_level >= MAX_DEPTH:
            mark = self.get_mark()
            raise YamlTooLarge(f"{self.source}:{mark.line + 1}:{mark.column + 1}: nested more than {MAX_DEPTH} "
                               "levels deep; a job file is a few levels of keys and lists")
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Any, index: Any) -> Any:
        collection = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        self.depth += collection
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlTooLarge(f"{self.source}:{mark.line + 1}:{mark.column + 1}: nested more than {MAX_DEPTH} "
                                  "levels deep; a job file is a few levels of keys and lists")
            if not self.check_event(yaml.AliasEvent):
                self.composed += 1  # written out (an alias's values are counted by _measure, once composed)
                if self.composed > self.max_nodes:  # stop reading here: a 1 MiB list would take seconds
                    raise YamlTooLarge(f"{self.source}: more than {self.max_nodes:,} values; a job file is small")
            return super().compose_node(parent, index)
        finally:
            self.depth -= collection


_Composer.yaml_implicit_resolvers = {}


def _measure(root: yaml.Node, source: str, max_nodes: int) -> None:
    """Refuse a document that is deeper than :data:`MAX_DEPTH` or holds more than ``max_nodes`` values once its
    aliases are expanded, or whose alias refers to itself; in time linear in the composed document (a shared
    node is measured once)."""
    measured: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()

    def too_deep(node: yaml.Node) -> ConfigError:
        return YamlTooLarge(f"{_where(source, node)}: nested more than {MAX_DEPTH} levels deep (aliases expanded); "
                           "a job file is a few levels of keys and lists")

    def visit(node: yaml.Node, level: int) -> tuple[int, int]:
        """(values, levels of lists and mappings) under ``node``, which is at ``level`` of them."""
        if isinstance(node, yaml.ScalarNode):
            return 1, 0
        if level > MAX_DEPTH:
            raise too_deep(node)
        key = id(node)
        if key in measured:
            count, height = measured[key]
            if level + height - 1 > MAX_DEPTH:
                raise too_deep(node)
            return count, height
        if key in open_nodes:
            raise YamlTooLarge(f"{_where(source, node)}: a YAML alias refers to the value it is in; write it out")
        open_nodes.add(key)
        count, height = 1, 1
        children = node.value if isinstance(node, yaml.SequenceNode) else [part for pair in node.value for part in pair]
        for child in children:
            child_count, child_height = visit(child, level + 1)
            count, height = count + child_count, max(height, child_height + 1)
            if count > max_nodes:
                raise YamlTooLarge(f"{source}: more than {max_nodes:,} values once its YAML aliases are expanded; "
                                  "a job file is small (write the values out)")
        open_nodes.discard(key)
        measured[key] = (count, height)
        return count, height

    visit(root, 1)


def _where(source: str, node: yaml.Node) -> str:
    mark = node.start_mark
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _raw(node: yaml.Node, source: str) -> Any:
    """A composed node as dicts, lists and Scalars (YAML 1.1 merge keys ``<<`` applied)."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag != _STR_TAG:
            raise ConfigError(f"{_where(source, node)}: YAML tags ({node.tag.rsplit(':', 1)[-1]}) are not read; "
                              "write the value plainly")
        check_text(node.value, _where(source, node))
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
        key = check_text(key_node.value, _where(source, key_node))
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


def parse_yaml(text: str, source: str, max_nodes: int = MAX_NODES) -> Any:
    """A YAML document as raw data (dicts, lists, :class:`Scalar`); None for an empty document.
    Syntax errors name ``source:line:column``; deeper than :data:`MAX_DEPTH` or larger than ``max_nodes``
    (aliases expanded) is refused."""
    if "\0" in text:
        raise NotText(f"{source}: contains a NUL byte; a job file is text")
    loader = None
    try:
        loader = _Composer(text, source, max_nodes)  # PyYAML's reader checks every character here: in the try
        node = loader.get_single_node()
        if node is not None:
            _measure(node, source, max_nodes)
    except yaml.reader.ReaderError as exc:
        line, column = _line_column(text, exc.position)
        character = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        raise NotText(f"{source}:{line}:{column}: holds {_describe(character)}; remove it") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return None if node is None else _raw(node, source)


def _line_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


def parse_mapping(text: str, source: str, what: str = "job file") -> dict[str, Any]:
    """A YAML document that must be a mapping (job, site and sweep files)."""
    try:
        data = parse_yaml(text, source, MAX_SWEEP_NODES if what == "sweep file" else MAX_NODES)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; fix the {what}" if "YAML syntax error" in str(exc) else str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else "a single value"
        raise ConfigError(f"{source}: a {what} must be a YAML mapping (key: value), got {kind}")
    return data


def parse_value(text: str, source: str, max_nodes: int = MAX_NODES) -> Any:
    """One value typed on the command line (``--set key=VALUE``, a ``--sweep`` value): YAML flow syntax
    (``[a, b]``, ``{k: v}``, quotes) is read; text that is not valid YAML is taken as it is (YAML that is
    too large is refused)."""
    if not text.strip():
        return Scalar("", where=source)
    try:
        data = parse_yaml(text, source, max_nodes)
    except (YamlTooLarge, NotText):
        raise
    except ConfigError:
        return Scalar(text, quoted=True, where=source)
    if isinstance(data, Scalar) and not data.quoted and "\n" in text:
        return Scalar(text, quoted=True, where=source)  # YAML folds a plain scalar's newline into a space
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
