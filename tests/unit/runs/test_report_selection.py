"""``hpc-train report`` (torch-free): the last epoch is the headline; the best epoch on the held-out split is
``best`` and exists only with one; the best test top-1 appears only as ``best_on_test``; the expected calibration
error is a column. Runs written here as the trainer writes them (config.json, metrics.jsonl)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from hpc_train.runs import report
from hpc_train.runs.index import load_run


def _run(root: Path, name: str, seed: int, val_fraction: float, records: list[dict]) -> Path:
    run_dir = root / "sweep" / name
    run_dir.mkdir(parents=True)
    config = {"name": "sweep", "train": {"seed": seed, "data": {"val_fraction": val_fraction}}}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def _record(epoch: int, top1: float, ece: float, val: float | None = None) -> dict:
    record = {"epoch": epoch, "global_step": 10 * epoch, "phase": "main", "top1": top1, "balanced": top1 - 0.01,
              "many": 0.9, "medium": 0.5, "few": top1 / 2, "ece": ece}
    if val is not None:
        record["val"] = {"top1": val, "balanced": val, "many": 0.9, "medium": 0.5, "few": 0.1}
    return record


def test_last_is_the_headline_best_is_held_out_only_and_best_on_test_is_named(tmp_path):
    # Without a held-out split: test-chosen best = epoch 2 (top-1 0.60), last = epoch 3.
    no_val = [_run(tmp_path, f"a{s}", s, 0.0, [_record(1, 0.40, 0.20), _record(2, 0.60 + s / 100, 0.10),
                                                _record(3, 0.55, 0.05 + s / 100)]) for s in range(2)]
    # With one: held-out best = epoch 1 (val 0.8), test-best = epoch 2.
    with_val = [_run(tmp_path, f"b{s}", s, 0.1, [_record(1, 0.45, 0.3, val=0.80), _record(2, 0.70, 0.2, val=0.50),
                                                  _record(3, 0.50, 0.1, val=0.60)]) for s in range(2)]
    results = [report.load(load_run(d), "completed") for d in no_val + with_val]
    data = report.summarise(results)
    rows = {json.dumps(r["config"]): r for r in data["configurations"]}
    plain, held_out = rows[json.dumps({"train.data.val_fraction": 0.0})], rows[json.dumps({"train.data.val_fraction": 0.1})]
    assert plain["last"]["top1"]["mean"] == pytest.approx(0.55) and plain["last"]["ece"]["mean"] == pytest.approx(0.055)
    assert plain["best"]["top1"]["n"] == 0  # no held-out split: no "best"
    assert plain["best_on_test"]["top1"]["values"] == pytest.approx([0.60, 0.61])
    assert plain["best_on_test"]["ece"]["std"] == pytest.approx(statistics.stdev([0.10, 0.10]))
    assert held_out["best"]["top1"]["values"] == pytest.approx([0.45, 0.45])  # chosen on val, reported on test
    assert held_out["best_on_test"]["top1"]["values"] == pytest.approx([0.70, 0.70])
    assert held_out["last"]["top1"]["mean"] == pytest.approx(0.50)
    text = report.format_report(data)
    blocks = text.split("\n\n")
    plain_block = next(b for b in blocks if "val_fraction=0.0" in b)
    held_block = next(b for b in blocks if "val_fraction=0.1" in b)
    # Rows follow the column header (summary lines such as GPU-hours come before it).
    header_at = lambda block: next(i for i, line in enumerate(block.splitlines()) if line.split()[:1] == ["epoch"])  # noqa: E731
    labels = lambda block: [line.split()[0] for line in block.splitlines()[header_at(block) + 1:]]  # noqa: E731
    assert labels(plain_block) == ["last", "best_on_test"] and labels(held_block) == ["last", "best", "best_on_test"]
    plain_lines = plain_block.splitlines()
    assert "ECE" in plain_lines[header_at(plain_block)] and "55.00" in plain_lines[header_at(plain_block) + 1]
