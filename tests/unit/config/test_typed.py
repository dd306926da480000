"""hpc_train/config/typed.py on its own: a small schema of the test's own (dataclass fields, as the job's are)
turned from raw values (Scalar: text as written) and Python values into typed ones; bad values and unknown keys
are ConfigErrors naming the dotted key."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import pytest

from hpc_train.config.typed import (MAX_INT, build, check_keys, convert, describe, field_type, plain_value, to_plain,
                                    valid_keys)
from hpc_train.config.yaml_text import Scalar
from hpc_train.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Inner:
    depth: int = 1
    rate: float = 0.5
    mode: Literal["fast", "slow"] = "fast"


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = "x"
    enabled: bool = False
    limit: int | None = None
    sync: Literal["auto", True, False] = "auto"
    tags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    args: Mapping[str, Any] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


def plain(text: str) -> Scalar:
    return Scalar(text)


def quoted(text: str) -> Scalar:
    return Scalar(text, quoted=True)


def test_scalars_are_read_by_the_field_type():
    built = build(Outer, {"name": plain("8"), "enabled": plain("yes"), "limit": plain("12"),
                          "inner": {"rate": plain("1e-3"), "mode": plain("slow")}})
    assert built == Outer(name="8", enabled=True, limit=12, inner=Inner(rate=0.001, mode="slow"))


@pytest.mark.parametrize("key, value, says", [
    ("limit", quoted("12"), "limit: must be"),              # a quoted number is text, not an int
    ("enabled", plain("maybe"), "enabled: must be true or false"),
    ("limit", plain("1" * 13), "out of range"),
    ("limit", plain("1" * 5000), r"1{20}\.\.\. is out of range"),  # never int() of thousands of digits
    ("inner", plain("3"), "inner: must be"),                 # a section given a single value
])
def test_a_bad_scalar_names_its_key(key, value, says):
    with pytest.raises(ConfigError, match=says):
        build(Outer, {key: value})


def test_a_nested_bad_value_names_the_dotted_key():
    with pytest.raises(ConfigError, match=r"^inner\.mode: must be one of"):
        build(Outer, {"inner": {"mode": plain("medium")}})


def test_null_unsets_an_optional_field_and_is_refused_elsewhere():
    assert build(Outer, {"limit": plain("null")}).limit is None
    with pytest.raises(ConfigError, match="inner.depth: must be .*got null"):
        build(Outer, {"inner": {"depth": plain("~")}})


def test_a_choice_of_words_and_bools_reads_the_bool_words():
    assert build(Outer, {"sync": plain("off")}).sync is False
    assert build(Outer, {"sync": plain("auto")}).sync == "auto"


def test_python_values_are_checked_against_the_same_types():
    assert convert(3, int, "n") == 3
    assert convert(2, float, "x") == 2.0 and isinstance(convert(2, float, "x"), float)
    assert convert(7, str, "qos") == "7"  # a number where text is expected is its decimal text
    for value, tp in ((True, int), ("3", int), (float("inf"), float), (MAX_INT + 1, int), ([1], str)):
        with pytest.raises(ConfigError):
            convert(value, tp, "k")


def test_lists_become_tuples_and_mappings_read_only():
    built = build(Outer, {"tags": [plain("a"), plain("b")], "env": {"FOO": plain("1")}})
    assert built.tags == ("a", "b")
    assert isinstance(built.env, types.MappingProxyType) and dict(built.env) == {"FOO": "1"}
    with pytest.raises(ConfigError, match=r"env\.FOO: must be"):
        build(Outer, {"env": {"FOO": [plain("x")]}})


def test_open_values_read_as_json_reads_them():
    assert plain_value(plain("1e5"), "a") == 1e5
    assert plain_value(quoted("1e5"), "a") == "1e5"
    assert plain_value(plain("true"), "a") is True and plain_value(plain("null"), "a") is None
    assert plain_value(plain("12"), "a") == 12 and plain_value(plain("word"), "a") == "word"
    assert plain_value([plain("1"), {"k": plain("v")}], "a") == (1, types.MappingProxyType({"k": "v"}))


def test_unknown_keys_are_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown key 'inner\.dpth'; valid keys under 'inner': depth, rate, mode"):
        build(Outer, {"inner": {"dpth": plain("1")}})
    with pytest.raises(ConfigError, match=r"^job\.yaml: unknown key 'nme'; valid keys at the top level: name,"):
        check_keys({"nme": plain("x")}, Outer, "job.yaml")
    with pytest.raises(ConfigError, match=r"^job\.yaml: unknown key 'inner\.dpth'; valid keys under 'inner'"):
        check_keys({"inner": {"dpth": plain("2")}}, Outer, "job.yaml")
    check_keys({"inner": {"depth": plain("2")}}, Outer, "job.yaml")  # known keys pass


def test_field_type_follows_a_dotted_key():
    assert field_type("inner.rate", Outer, "--set") is float
    assert field_type("env.ANY_NAME", Outer, "--set") is str
    with pytest.raises(ConfigError, match="takes one more key"):
        field_type("env.A.B", Outer, "--set")
    with pytest.raises(ConfigError, match="it has no sub-keys"):
        field_type("name.first", Outer, "--set")


def test_to_plain_and_back_is_the_same_object():
    built = build(Outer, {"tags": [plain("a")], "env": {"K": plain("v")}, "limit": plain("4")})
    data = to_plain(built)
    assert data["env"] == {"K": "v"} and data["tags"] == ["a"] and data["inner"]["mode"] == "fast"
    assert build(Outer, data) == built


def test_valid_keys_and_describe():
    assert valid_keys(Inner) == ["depth", "rate", "mode"]
    assert describe(int | None) == "an integer (or null)"
