"""The schema at work: dataclass fields turn raw values into typed ones, and unknown keys are refused.

Values come in two forms. From files and ``--set``: :class:`~hpc_train.config.yaml_text.Scalar` (the
text as written), converted by the field's type — a text field gets exactly the text, a bool field
accepts true/false, yes/no, on/off, an integer field decimal digits, a number field finite decimals;
``null``, ``~`` and an empty value mean "unset" where the field may be unset. From code (CLI flags,
sweep points already converted, ``to_plain`` output): Python values, checked against the same types.
Either way a bad value is a :class:`~hpc_train.errors.ConfigError` naming the dotted key.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import re
import types
import typing
from typing import Any, Literal, Mapping, Sequence

from ..errors import ConfigError
from .yaml_text import Scalar, check_text

MAX_INT = 2**31 - 1
"""Every integer in a job fits Slurm's 32-bit fields; 10^20 nodes is a typo, not a request."""

_NULL_WORDS = frozenset({"", "~", "null", "Null", "NULL"})
_TRUE_WORDS = frozenset({"true", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "no", "off"})
_INT_RE = re.compile(r"[-+]?[0-9]+\Z")
_FLOAT_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")


def to_plain(obj: Any) -> Any:
    """Dataclasses, tuples and mappings as plain dicts/lists (for YAML and JSON)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # Cached: get_type_hints re-evaluates every annotation string, and a 1000-point sweep asks ~8,000 times
    # (80 % of resolving it). The config classes are frozen and callers only read the result.
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True
    return tp, False


def _is_flag_or_text(tp: Any) -> bool:
    """``str | bool``: an ``#SBATCH`` value (text) or a bare flag (true) / nothing (false)."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {str, bool}


def _is_open_mapping(tp: Any) -> bool:
    tp, _ = _strip_optional(tp)
    return typing.get_origin(tp) in (collections.abc.Mapping, dict) or tp is dict


def _dataclass_type(tp: Any) -> type | None:
    tp, _ = _strip_optional(tp)
    return tp if dataclasses.is_dataclass(tp) else None


def valid_keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


_PLAIN_WORDS: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string",
                                Any: "any value"}


def describe(tp: Any) -> str:
    """What a field accepts, in words (for messages)."""
    tp, optional = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        text = "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    elif isinstance(tp, type) and tp in _PLAIN_WORDS or tp is Any:
        text = _PLAIN_WORDS[tp]
    elif _is_flag_or_text(tp):
        text = "a string, or true for a bare flag"
    elif origin is tuple:
        text = "a list"
    elif _is_open_mapping(tp):
        text = "a mapping"
    elif dataclasses.is_dataclass(tp):
        text = "a mapping with keys " + ", ".join(valid_keys(tp))
    else:
        text = str(tp)
    return text + (" (or null)" if optional else "")


def _bad(path: str, tp: Any, value: Any) -> ConfigError:
    shown = value.text if isinstance(value, Scalar) else value
    return ConfigError(f"{path}: must be {describe(tp)}, got {shown!r}")


def _text(value: str, path: str) -> str:
    return check_text(value, path)


def _checked_int(value: int, path: str) -> int:
    if not -MAX_INT <= value <= MAX_INT:
        raise ConfigError(f"{path}: {value} is out of range (at most {MAX_INT:,} in size)")
    return value


def _checked_float(value: float, path: str, tp: Any) -> float:
    if not math.isfinite(value):
        raise _bad(path, tp, value)
    return value


def _scalar(value: Scalar, tp: Any, path: str) -> Any:
    """One scalar as written, read by the field's type."""
    inner, optional = _strip_optional(tp)
    text = value.text
    if not value.quoted and text in _NULL_WORDS and (optional or inner is not str):
        if optional:
            return None
        raise ConfigError(f"{path}: must be {describe(tp)}, got null")
    origin = typing.get_origin(inner)
    if inner is str:
        return _text(text, path)
    if origin is Literal:
        choices = typing.get_args(inner)
        if text in choices:
            return text
        word = text.lower()
        # A choice of words and true/false (``sync_bn: auto | true | false``) reads the bool words as bools.
        if not value.quoted and True in choices and (word in _TRUE_WORDS or word in _FALSE_WORDS):
            return word in _TRUE_WORDS
        raise _bad(path, tp, value)
    if inner is bool:
        word = text.lower()
        if word in _TRUE_WORDS or word in _FALSE_WORDS:
            return word in _TRUE_WORDS
        raise ConfigError(f"{path}: must be true or false (yes/no, on/off), got {text!r}")
    if inner is int:
        if value.quoted or not _INT_RE.match(text):
            raise _bad(path, tp, value)
        if len(text.lstrip("+-")) > 12:  # also keeps int() off thousands of digits
            shown = text if len(text) <= 24 else text[:20] + "..."
            raise ConfigError(f"{path}: {shown} is out of range (at most {MAX_INT:,} in size)")
        return _checked_int(int(text, 10), path)
    if inner is float:
        if value.quoted or not (_INT_RE.match(text) or _FLOAT_RE.match(text)):
            raise _bad(path, tp, value)
        return _checked_float(float(text), path, tp)
    if _is_flag_or_text(inner):
        if not value.quoted and text.lower() in ("true", "false"):
            return text.lower() == "true"
        return _text(text, path)
    raise _bad(path, tp, value)  # a list, mapping or section given a single value


def _python(value: Any, tp: Any, path: str) -> Any:
    """A Python value (a CLI flag, a converted sweep value, plain data) checked against the field type."""
    inner, _ = _strip_optional(tp)
    origin = typing.get_origin(inner)
    if origin is Literal:
        if value not in typing.get_args(inner):
            raise _bad(path, tp, value)
        return value
    if inner is bool:
        if not isinstance(value, bool):
            raise _bad(path, tp, value)
        return value
    if inner is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(path, tp, value)
        return _checked_int(value, path)
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(path, tp, value)
        return _checked_float(float(value), path, tp)
    if inner is str:
        # A number given where text is expected (``qos: 1`` from code) is its decimal text.
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _bad(path, tp, value)
        return _text(str(value), path)
    if _is_flag_or_text(inner):
        if isinstance(value, bool):
            return value
        if not isinstance(value, (str, int, float)):
            raise _bad(path, tp, value)
        return _text(str(value), path)
    raise _bad(path, tp, value)


def plain_value(value: Any, path: str) -> Any:
    """A value the schema leaves open (a plug-in's ``args``), read as JSON reads it: true/false, null, decimal
    integers and numbers are typed, quoted or other text stays text; lists and mappings hold the same."""
    if isinstance(value, Scalar):
        text = value.text
        if value.quoted:
            return _text(text, path)
        if text in ("true", "false"):
            return text == "true"
        if text in _NULL_WORDS:
            return None
        if _INT_RE.match(text) and len(text.lstrip("+-")) <= 12:
            return _checked_int(int(text, 10), path)
        if _FLOAT_RE.match(text):
            return _checked_float(float(text), path, float)
        return _text(text, path)
    if isinstance(value, Mapping):
        return types.MappingProxyType({_text(str(k), path): plain_value(v, f"{path}.{k}") for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(plain_value(v, f"{path}[{i}]") for i, v in enumerate(value))
    if isinstance(value, float):
        return _checked_float(value, path, float)
    if isinstance(value, str):
        return _text(value, path)
    if value is None or isinstance(value, (bool, int)):
        return value
    raise ConfigError(f"{path}: must be text, a number, true/false, null, a list or a mapping, got {value!r}")


def convert(value: Any, tp: Any, path: str) -> Any:
    """Check/convert one raw or Python value against a field type; ConfigError naming ``path``."""
    if tp is Any:
        return plain_value(value, path)
    inner, optional = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path}: must be {describe(tp)}, got null")
    if isinstance(value, Scalar):  # a single value as written (null, or refused for a list, mapping or section)
        return _scalar(value, tp, path)
    if dataclasses.is_dataclass(inner):
        if isinstance(value, inner):  # already built (a swept section)
            return value
        if not isinstance(value, Mapping):
            raise _bad(path, tp, value)
        return build(inner, value, path)
    if typing.get_origin(inner) is tuple:
        (item_tp, _ellipsis) = typing.get_args(inner)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise _bad(path, tp, value)
        return tuple(convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value))
    if _is_open_mapping(inner):
        if not isinstance(value, Mapping):
            raise _bad(path, tp, value)
        _key_tp, value_tp = typing.get_args(inner)
        out = {}
        for key, item in value.items():
            item_path = f"{path}.{key}"
            if value_tp is Any:
                out[_text(str(key), item_path)] = plain_value(item, item_path)
                continue
            if isinstance(item, (Mapping, list, tuple)):
                raise ConfigError(f"{item_path}: must be {describe(value_tp)}, got {to_plain(item)!r}")
            if value_tp is str and isinstance(item, bool):  # from code: a bool becomes the YAML word
                item = "true" if item else "false"
            out[_text(str(key), item_path)] = convert(item, value_tp, item_path)
        return types.MappingProxyType(out)
    return _python(value, tp, path)


def build(cls: type, data: Mapping[str, Any], path: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with the list of valid ones."""
    hints = _hints(cls)
    names = valid_keys(cls)
    unknown = [k for k in data if k not in names]
    if unknown:
        raise unknown_key("", path, str(unknown[0]), names)
    return cls(**{k: convert(v, hints[k], join(path, k)) for k, v in data.items()})


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def unknown_key(source: str, path: str, key: str, names: Sequence[str]) -> ConfigError:
    """The one message for a key the schema does not have: where it came from, and the valid keys there."""
    where = f"under '{path}'" if path else "at the top level"
    prefix = f"{source}: " if source else ""
    return ConfigError(f"{prefix}unknown key {join(path, key)!r}; valid keys {where}: {', '.join(names)}")


def check_keys(data: Mapping[str, Any], cls: type, source: str, path: str = "") -> None:
    """Reject unknown keys in one layer (job file, site file) before merging, naming the source."""
    names = valid_keys(cls)
    hints = _hints(cls)
    for key, value in data.items():
        if key not in names:
            raise unknown_key(source, path, str(key), names)
        sub = _dataclass_type(hints[key])
        if sub is not None and isinstance(value, Mapping):
            check_keys(value, sub, source, join(path, key))


def field_type(dotted: str, cls: type, source: str) -> Any:
    """The type of the field a dotted key (``train.loss.name``, ``slurm.env.NCCL_DEBUG``) names; unknown
    keys are refused with the valid keys at that level."""
    parts = dotted.split(".")
    current: Any = cls
    walked = ""
    for i, part in enumerate(parts):
        names = valid_keys(current)
        if part not in names:
            raise unknown_key(source, walked, part, names)
        tp = _hints(current)[part]
        walked = join(walked, part)
        rest = parts[i + 1:]
        if not rest:
            return tp
        if _is_open_mapping(tp):
            if len(rest) != 1:
                raise ConfigError(f"{source}: {walked} takes one more key, e.g. {walked}.NAME=value")
            return typing.get_args(_strip_optional(tp)[0])[1]
        sub = _dataclass_type(tp)
        if sub is None:
            raise ConfigError(f"{source}: {walked} is {describe(tp)}, it has no sub-keys")
        current = sub
    raise ConfigError(f"{source}: empty key")  # pragma: no cover - split() never returns no parts
