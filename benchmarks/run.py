"""Run the side-by-side benchmarks and write ``benchmarks/results.json`` (see BENCHMARKS.md).

    .venv/bin/python benchmarks/run.py            # make bench: full sizes (CIFAR-10-LT epochs), ~20-30 min
    .venv/bin/python benchmarks/run.py --quick    # make bench-quick: small sizes, < 3 min on 2 cores

Each benchmark times ours and its reference interleaved in this run and reports medians; the ratios
are what to read (the absolute figures move with the machine's load, which is recorded too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

RESULTS = Path(__file__).resolve().with_name("results.json")

# Sizes per mode. Quick keeps every benchmark but shrinks epochs and repeats; full runs CIFAR-10-LT-sized
# training epochs (12,406 images) and a 10,000-image evaluation.
MODES: dict[str, dict[str, Any]] = {
    "quick": {"cli_rounds": 5, "pipeline_rounds": 3, "pipeline_max_per_class": 5000,
              "train_rounds": 3, "train_max_per_class": 250,
              "train_variants": ["ours_channels_last", "ours_heartbeat", "reference"],
              "dist_rounds": 2, "dist_steps": 3, "eval_per_class": 100},
    "full": {"cli_rounds": 15, "pipeline_rounds": 5, "pipeline_max_per_class": 5000,
             "train_rounds": 3, "train_max_per_class": 5000,
             "train_variants": ["ours", "ours_channels_last", "ours_heartbeat", "reference"],
             "dist_rounds": 3, "dist_steps": 10, "eval_per_class": 1000},
}

GOALS = {"cli_vs_torch_import": ("<=", 0.06), "pipeline_speedup": (">=", 10.0),
         "train_epoch_speedup": (">=", 1.2), "heartbeat_cost": ("<=", 0.01)}


def gpu(quick: bool, log_dir: Path) -> dict[str, Any]:
    """6. The GPU benchmark runs where torch sees CUDA (full mode); otherwise it is recorded as not measured."""
    import subprocess

    import torch

    if not torch.cuda.is_available():
        return {"measured": False, "reason": "no CUDA device on this machine: GPU figures not measured"}
    if quick:
        return {"measured": False, "reason": "quick mode: run `make bench` or benchmarks/gpu.py for the GPU figures"}
    out = log_dir / "gpu.json"
    subprocess.run([common.PYTHON, "benchmarks/gpu.py", "--out", str(out)], cwd=common.REPO, env=common.child_env(),
                   check=True, stdout=subprocess.DEVNULL, timeout=600)
    return json.loads(out.read_text())


def benchmarks(mode: dict[str, Any], log_dir: Path, quick: bool) -> dict[str, Callable[[], dict[str, Any]]]:
    from benchmarks import cli_startup, dist_bench, input_pipeline, scaling, train_epoch

    return {
        "cli_startup": lambda: cli_startup.run(rounds=mode["cli_rounds"]),
        "input_pipeline": lambda: input_pipeline.run(rounds=mode["pipeline_rounds"],
                                                     max_per_class=mode["pipeline_max_per_class"]),
        "train_epoch": lambda: train_epoch.run(rounds=mode["train_rounds"], max_per_class=mode["train_max_per_class"],
                                               variants=tuple(mode["train_variants"]), log_dir=log_dir),
        "dist": lambda: dist_bench.run(rounds=mode["dist_rounds"], steps=mode["dist_steps"],
                                       eval_per_class=mode["eval_per_class"], log_dir=log_dir / "dist"),
        "gpu": lambda: gpu(quick, log_dir),
        "scaling": scaling.run,
    }


def ratios(results: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    cli = results.get("cli_startup")
    if cli:
        out["cli_vs_torch_import"] = cli["render_vs_torch_import"]
        out["cli_vs_python_pass"] = cli["render_vs_python_pass"]
    pipe = results.get("input_pipeline")
    if pipe:
        out["pipeline_speedup"] = pipe["speedup"]
        out["pipeline_speedup_channels_last"] = pipe["speedup_channels_last"]
    train = results.get("train_epoch")
    if train:
        out["train_epoch_speedup"] = train["speedup_ours_channels_last"]
        if "speedup_ours" in train:
            out["train_epoch_speedup_nchw"] = train["speedup_ours"]
        out["train_peak_rss_ours_vs_reference"] = (train["ours_channels_last_peak_rss_mb"]
                                                   / train["reference_peak_rss_mb"])
        out["train_peak_pss_ours_vs_reference"] = (train["ours_channels_last_peak_pss_with_workers_mb"]
                                                   / train["reference_peak_pss_with_workers_mb"])
        if "ours_heartbeat_cost" in train:  # its share of the epoch, timed directly; and the two sides' ratio
            out["heartbeat_cost"] = train["ours_heartbeat_cost"]["median"]
            out["heartbeat_step_ratio"] = train["heartbeat_step_ratio"]
    d = results.get("dist")
    if d:
        out["ddp_step_ratio"] = d["ddp_step_ratio"]
        out["eval_ws2_vs_ws1"] = d["eval_ws2_vs_ws1"]
    g = results.get("gpu")
    if g and g.get("measured"):
        out.update({f"gpu_{k}": v for k, v in g["ratios"].items()})
    return out


def goal_report(r: dict[str, float]) -> dict[str, Any]:
    out = {}
    for name, (op, target) in GOALS.items():
        if name in r:
            met = r[name] <= target if op == "<=" else r[name] >= target
            out[name] = {"value": r[name], "goal": f"{op} {target:g}", "met": met}
    return out


def table(results: dict[str, Any]) -> str:
    """The summary printed at the end (and pasted into BENCHMARKS.md)."""
    rows: list[tuple[str, str, str, str]] = []

    def med(d: dict[str, Any], key: str) -> float:
        return d[key]["median"]

    if "cli_startup" in results:
        c = results["cli_startup"]
        rows.append(("CLI start-up (s)", f"{med(c, 'hpc_train_render_wall_s'):.3f} render",
                     f"{med(c, 'python_import_torch_wall_s'):.3f} import torch / "
                     f"{med(c, 'python_pass_wall_s'):.3f} pass",
                     f"{c['render_vs_torch_import']:.3f} of torch import (goal <= 0.06)"))
    if "input_pipeline" in results:
        p = results["input_pipeline"]
        rows.append(("Input pipeline (img/s)",
                     f"{med(p, 'ours_images_per_s'):,.0f} (NHWC {med(p, 'ours_channels_last_images_per_s'):,.0f})",
                     f"{med(p, 'reference_images_per_s'):,.0f}", f"{p['speedup']:.1f}x (goal >= 10x)"))
    if "train_epoch" in results:
        t = results["train_epoch"]
        nchw = "ours_images_per_s" in t
        rows.append(("Train epoch, CPU (img/s)",
                     f"{med(t, 'ours_channels_last_images_per_s'):.1f}"
                     + (f" (NCHW {med(t, 'ours_images_per_s'):.1f})" if nchw else ""),
                     f"{med(t, 'reference_images_per_s'):.1f}",
                     f"{t['speedup_ours_channels_last']:.2f}x" + (f" (NCHW {t['speedup_ours']:.2f}x)" if nchw else "")
                     + " (goal >= 1.2x)"))
        rows.append(("Train peak memory (MiB)",
                     f"RSS {t['ours_channels_last_peak_rss_mb']:.0f}, "
                     f"PSS {t['ours_channels_last_peak_pss_with_workers_mb']:.0f}",
                     f"RSS {t['reference_peak_rss_mb']:.0f}, PSS+workers {t['reference_peak_pss_with_workers_mb']:.0f}",
                     f"{results['ratios']['train_peak_pss_ours_vs_reference']:.2f}x (PSS)"))
    if "dist" in results:
        d = results["dist"]
        rows.append(("Exact eval, ws2 vs ws1 (s)", f"{med(d, 'eval_ws2_wall_s'):.2f}",
                     f"{med(d, 'eval_ws1_wall_s'):.2f}",
                     f"{d['eval_ws2_vs_ws1']:.2f}x time; identical per-class: {d['eval_identical_per_class']}"))
        rows.append(("DDP step, 2x64 vs 1x128 (s)", f"{med(d, 'step_ws2_s'):.3f}", f"{med(d, 'step_ws1_s'):.3f}",
                     f"{d['ddp_step_ratio']:.2f}x step time"))
    if "gpu" in results:
        g = results["gpu"]
        if g.get("measured"):
            best = g["projected_200_epochs_s"]
            ratio = max(g["ratios"].values()) if g["ratios"] else float("nan")
            rows.append(("GPU train (img/s), 200-epoch projection",
                         f"{g['sides'][best['variant']]['train_images_per_s']:,.0f}; {best['best']:.0f} s",
                         f"{g['sides'].get('reference', {}).get('train_images_per_s', float('nan')):,.0f}",
                         f"{ratio:.1f}x (goal >= 5x; <= 180 s)"))
        else:
            rows.append(("GPU (NCCL, bf16, channels_last)", "not measured", "not measured", g.get("reason", "")))
    head = ("benchmark", "ours", "reference", "ratio")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and fewer repeats (< 3 min on 2 cores)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this benchmark (repeatable): cli_startup, input_pipeline, train_epoch, "
                             "dist, gpu, scaling")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = parser.parse_args(argv)
    mode_name = "quick" if args.quick else "full"
    mode = MODES[mode_name]
    start = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="hpc-train-bench-"))
    machine = common.machine_info()
    results: dict[str, Any] = {"machine": machine, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "mode": mode_name, "sizes": mode, "worker_logs": str(log_dir)}
    wall: dict[str, float] = {}
    for name, bench in benchmarks(mode, log_dir, args.quick).items():
        if args.only and name not in args.only:
            continue
        print(f"[bench] {name} ...", flush=True)
        t0 = time.perf_counter()
        results[name] = bench()
        wall[name] = time.perf_counter() - t0
        print(f"[bench] {name} done in {wall[name]:.1f} s", flush=True)
    results["ratios"] = ratios(results)
    results["goals"] = goal_report(results["ratios"])
    machine["load_avg_1min_at_end"] = os.getloadavg()[0]
    results["wall_s"] = {**wall, "total": time.perf_counter() - start}
    text = table(results)
    results["table"] = text
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print()
    print(f"{mode_name} run, {machine['cpu']}, {machine['usable_cores']} cores, torch {machine['torch']}, "
          f"load average {machine['load_avg_1min_at_start']:.1f} -> {machine['load_avg_1min_at_end']:.1f}")
    print(text)
    print(f"\nratios: {json.dumps({k: round(v, 3) for k, v in results['ratios'].items()})}")
    print(f"wrote {args.out} in {results['wall_s']['total']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
