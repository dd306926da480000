"""The result line of one stage of ``benchmarks/gpu_session.sh``: that stage's figures, read from the files it
wrote, as one JSON line for ``session.jsonl`` (stdlib only: it runs wherever the session runs, torch or not).

    python3 benchmarks/gpu_session_results.py STAGE WORK_DIR OUT_DIR

A file the stage should have written and did not (it crashed or was stopped at its cap) is named under
``missing``; whatever was written until then is still read (the stages write their reports as they go).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

END_LINE = re.compile(r"^(\d+) epochs in ([\d.]+) s "
                      r"\(train ([\d,]+|-) img/s, eval ([\d,]+|-) img/s, set-up ([\d.]+) s\)$")
"""The trainer's end line (``end_line`` in hpc_train/train/observe/progress.py: rates with thousands separators,
``-`` for none)."""


def _rate(text: str) -> int | None:
    return None if text == "-" else int(text.replace(",", ""))


def _json(path: Path, missing: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        missing.append(path.name)
        return {}


def recipe(work: Path, out: Path, missing: list[str]) -> dict[str, Any]:
    log = work / "logs" / "recipe.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    ends = [m for m in map(END_LINE.match, lines) if m]
    result: dict[str, Any] = {"end_line": ends[-1].group(0) if ends else None}
    if ends:
        epochs, seconds, train, evals, setup = ends[-1].groups()
        result.update(epochs=int(epochs), seconds=float(seconds), train_img_s=_rate(train), eval_img_s=_rate(evals),
                      setup_s=float(setup))
    else:
        missing.append("the end line")
    metrics = work / "recipe-run" / "metrics.jsonl"
    records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    result["epochs_evaluated"] = max((r.get("epoch", 0) for r in records), default=0)  # how far a stopped run got
    if ends:
        timing = _json(work / "recipe-run" / "summary.json", missing).get("timing", {})
        result["cuda_graphs"] = timing.get("cuda_graphs")
        result["checkpoint_stall_ms_max"] = timing.get("checkpoint_stall_ms_max")
    return result


def bench(work: Path, out: Path, missing: list[str]) -> dict[str, Any]:
    report = _json(out / "gpu_bench.json", missing)
    keep = ("train_images_per_s", "eval_images_per_s", "epoch_s_median", "epochs_timed", "setup_s", "first_epoch_s",
            "projected_200_epochs_s", "graphs", "fell_back")
    sides = {name: {k: side.get(k) for k in keep if k in side} for name, side in report.get("sides", {}).items()}
    stages = report.get("stages") or [{}]
    return {"sides": sides, "ratios": report.get("ratios"),
            "projected_200_epochs_s": report.get("projected_200_epochs_s"), "goals": report.get("goals"), "skipped": report.get("skipped"), "last_stage": stages[-1].get("stage"),
            "peak_gpu_memory_mb": report.get("peak_gpu_memory_mb"), "environment": report.get("environment")}


def gpu_check(work: Path, out: Path, missing: list[str]) -> dict[str, Any]:
    report = _json(out / "gpu_check.json", missing)
    checks = report.get("checks", {})
    return {"ok": report.get("ok"), "total_s": report.get("total_s"),
            "checks": {name: c.get("status") for name, c in checks.items()},
            "why": {name: str(c.get("why") or c.get("error") or c.get("log_tail") or c)[-300:]  # a log's end
                    for name, c in checks.items() if c.get("status") != "PASS"}}


def pack(work: Path, out: Path, missing: list[str]) -> dict[str, Any]:
    report = _json(out / "gpu_pack.json", missing)
    variants = report.get("variants", {})
    return {"k": report.get("k"), "mps": report.get("mps"), "skipped": report.get("skipped"),
            **{key: report[key] for key in ("packed_vs_alone", "packed_mps_vs_alone") if key in report},
            "aggregate_img_s": {name: v.get("aggregate_img_s") for name, v in variants.items()},
            "exit_codes": {name: v.get("exit_codes") for name, v in variants.items()}}


STAGES = {"recipe": recipe, "bench": bench, "gpu_check": gpu_check, "pack": pack}


def _short(value: Any) -> Any:
    """Floats to 4 significant digits, all the way down: the figures, not their noise."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_short(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in STAGES:
        print(f"usage: gpu_session_results.py {{{','.join(STAGES)}}} WORK_DIR OUT_DIR", file=sys.stderr)
        return 2
    missing: list[str] = []
    result = STAGES[argv[0]](Path(argv[1]), Path(argv[2]), missing)
    print(json.dumps(_short({"stage": f"{argv[0]}_result", **result, **({"missing": missing} if missing else {})}),
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
