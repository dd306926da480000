"""Sweeps: ``--sweep key=v1,v2`` grids and sweep files, as typed points (one job, and one array task, each).

Every value is read once, by the type of the field its key names, and stays typed: a ``"yes"`` swept
over a text field is the text "yes", a ``null`` over an optional field is unset. A sweep varies
``train.*`` keys only (one job array shares one allocation shape), and has at most :data:`MAX_POINTS`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ConfigError
from .job import JobSpec
from .typed import convert, field_type
from .yaml_text import MAX_SWEEP_NODES, load_yaml_file, parse_value

Point = dict[str, Any]

MAX_POINTS = 10_000
"""Points of one sweep. A sweep larger than the cluster's MaxArraySize (Slurm's default 1001 allows indices 0-1000)
is submitted as several job arrays under one run name (:mod:`hpc_train.slurm.queue`)."""


def _key_type(key: str, source: str) -> Any:
    tp = field_type(key, JobSpec, source)
    if not key.startswith("train."):
        raise ConfigError(f"{source}: one job array shares one allocation shape, so a sweep may only vary "
                          "train.* keys; submit separate jobs to vary slurm.*")
    return tp


def _typed(key: str, values: Sequence[Any], source: str) -> list[Any]:
    tp = _key_type(key, source)
    return [convert(value, tp, key) for value in values]


def _split_values(raw: str, source: str) -> list[Any]:
    """``a,b,c`` or a YAML flow list ``[a, 'b,c']`` as raw values."""
    if raw.strip().startswith("["):
        values = parse_value(raw, source, MAX_SWEEP_NODES)
        if not isinstance(values, list):
            raise ConfigError(f"{source}: {raw!r} is not a list")
        return values
    return [parse_value(piece, source) for piece in raw.split(",")]


def _check_size(count: int, source: str) -> None:
    if count > MAX_POINTS:
        raise ConfigError(f"{source}: {count:,} sweep points; a sweep holds at most {MAX_POINTS:,} "
                          "(submitted as job arrays of the cluster's MaxArraySize); split the sweep")


def sweep_points(sweeps: Sequence[str] = (), sweep_file: Path | None = None) -> list[Point]:
    """The grid (Cartesian product) of ``--sweep key=v1,v2`` options, or the points of a sweep file: a
    mapping ``{key: [values]}`` (grid) or ``{points: [{key: value}, ...]}`` (explicit points, combined
    with any command-line grid). Values are typed by their fields; nothing is resolved yet."""
    axes: list[tuple[str, list[Any]]] = []
    points: list[Point] | None = None
    for item in sweeps:
        if "=" not in item:
            raise ConfigError(f"--sweep {item!r}: expected KEY=V1,V2,..., e.g. --sweep train.loss.name=ce,balanced_softmax")
        key, raw = (part.strip() for part in item.split("=", 1))
        source = f"--sweep {key}"
        values = _split_values(raw, source)
        if not values:
            raise ConfigError(f"--sweep {item!r}: no values")
        _check_size(len(values), source)
        if any(key == seen for seen, _ in axes):
            raise ConfigError(f"--sweep {key} is given twice; give its values once: --sweep {key}=V1,V2,...")
        axes.append((key, _typed(key, values, source)))
    if sweep_file is not None:
        if sweep_file.suffix not in (".yaml", ".yml"):
            raise ConfigError(f"sweep file {sweep_file} must be YAML (.yaml)")
        data = load_yaml_file(sweep_file, "sweep file")
        if "points" in data:
            raw_points = data.pop("points")
            if data:
                raise ConfigError(f"{sweep_file}: give either 'points' or {{key: [values]}}, not both")
            if not isinstance(raw_points, list) or not all(isinstance(p, dict) for p in raw_points):
                raise ConfigError(f"{sweep_file}: 'points' must be a list of {{key: value}} mappings")
            _check_size(len(raw_points), str(sweep_file))
            points = [{key: _typed(key, [value], str(sweep_file))[0] for key, value in point.items()}
                      for point in raw_points]
        for key, values in data.items():
            if any(key == seen for seen, _ in axes):
                raise ConfigError(f"{sweep_file}: {key} is swept by --sweep too; sweep it in one place")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{sweep_file}: {key} must map to a non-empty list of values")
            axes.append((key, _typed(key, values, str(sweep_file))))
    size = math.prod(len(values) for _, values in axes) * (len(points) if points is not None else 1)
    _check_size(size, "--sweep" if sweeps else str(sweep_file))
    grid: list[Point] = [{}]
    for key, values in axes:
        grid = [{**point, key: value} for point in grid for value in values]
    if points is not None:
        return [{**p, **g} for p in points for g in grid]
    return grid if axes else []


def apply_point(merged: Mapping[str, Any], point: Point) -> dict[str, Any]:
    """The layered job data with one point's (typed) values set."""
    out: dict[str, Any] = {**merged}
    for dotted, value in point.items():
        node = out
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, Mapping) else {}
            node = node[part]
        node[parts[-1]] = value
    return out

