"""Single-field bounds are declared beside their fields (hpc_train/config/bounds.py) and every one of them is
enforced: a value just outside a bound is refused with exit 2, naming the dotted key, and the value at a
closed bound is accepted. Walks the schema, so a new bounded field is tested the day it is declared."""

import dataclasses
import typing

import pytest

from hpc_train.config import NO_SITE, JobSpec, resolve
from hpc_train.config.bounds import Bounds
from hpc_train.errors import ConfigError


def _bounded(cls: type, path: str) -> list[tuple[str, Bounds, type]]:
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        if "bounds" in f.metadata:
            number = int if int in (typing.get_args(hints[f.name]) or (hints[f.name],)) else float
            found.append((key, f.metadata["bounds"], number))
        inner = hints[f.name]
        if dataclasses.is_dataclass(inner):
            found += _bounded(inner, key)
    return found


BOUNDED = _bounded(JobSpec, "")


def _outside(b: Bounds, number: type) -> list:
    step = 1 if number is int else 0.5
    values = []
    if b.low is not None:
        values.append(number(b.low) if b.low_open else number(b.low - step))
    if b.high is not None:
        values.append(number(b.high) if b.high_open else number(b.high + step))
    return values


def test_the_schema_declares_bounds_in_both_sections():
    keys = {key for key, _, _ in BOUNDED}
    assert {"slurm.nodes", "train.epochs", "train.optim.lr", "train.data.val_fraction"} <= keys
    assert len(keys) >= 35


@pytest.mark.parametrize("key, bounds, number", BOUNDED, ids=[key for key, _, _ in BOUNDED])
def test_a_value_outside_a_bound_is_refused_naming_its_key(key, bounds, number):
    for value in _outside(bounds, number):
        with pytest.raises(ConfigError) as refused:
            resolve(None, sets=[f"{key}={value}"], site=NO_SITE)
        assert str(refused.value).startswith(f"{key} must be "), str(refused.value)
        assert f"got {value}" in str(refused.value)


@pytest.mark.parametrize("key, bounds, number", [b for b in BOUNDED if b[1].low is not None and not b[1].low_open],
                         ids=[key for key, b, _ in BOUNDED if b.low is not None and not b.low_open])
def test_the_value_at_a_closed_bound_passes_the_bound(key, bounds, number):
    try:
        resolve(None, sets=[f"{key}={number(bounds.low)}"], site=NO_SITE)
    except ConfigError as exc:  # a rule between fields may still refuse it, but not this bound
        assert not str(exc).startswith(f"{key} must be "), str(exc)


def test_a_negative_data_seed_is_refused():
    # Review of issue 19, M10: numpy's RandomState(-1) raised a ValueError traceback in the rank (the job queued).
    with pytest.raises(ConfigError, match=r"train.data.seed must be 0 or more, got -1"):
        resolve(None, sets=["train.data.seed=-1"], site=NO_SITE)
    assert resolve(None, sets=["train.data.seed=4294967"], site=NO_SITE).spec.train.data.seed == 4294967
