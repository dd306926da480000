"""GPU packing benchmark (``--pack K``): aggregate training img/s of K sweep points packed on one GPU
against one run alone — a prepared stage for a machine with an NVIDIA GPU (at most 3 × 60 s; about a
minute expected on one H200).

    PYTHONPATH=. python3 benchmarks/gpu_pack.py --out gpu_pack.json            # on the GPU machine
    PYTHONPATH=. python3 benchmarks/gpu_pack.py --device cpu --tiny            # smoke test anywhere (~20 s)

Each variant is the trainer as ``--pack`` runs it: separate processes, one rank each, started by the pack
runner (:func:`hpc_train.local.launcher.run_launches`), each with its own run directory — the CIFAR-10-LT-sized
LDAM-DRW recipe (ResNet-32, batch 128, bf16 + channels_last, synthetic CIFAR-shaped data). Variants, each
under its own timeout, their JSON printed as each ends (a slow one costs only itself):

* ``alone``: one run (with the captured step, ``train.cuda_graphs: on``, where this trainer has it);
* ``packed``: K runs at once, plain: separate processes only time-slice a GPU;
* ``packed_mps``: the same under an MPS daemon started for this variant (``nvidia-cuda-mps-control -d``,
  its own pipe directory), which lets the K processes' kernels overlap on the GPU. Where the daemon cannot be
  started (not installed, refused, no answer within 20 s) the report says why (``mps``, ``skipped``) and
  the stage goes on without it.

Reported per variant: each run's steady-state training img/s (the median of its progress lines after the
first epoch), their sum (aggregate), and aggregate ÷ alone. Goal: packed (K = 4) >= 2x alone. Each variant
runs under ``--timeout-s`` (its runs are ended at it, the preemption signal 5 s before), and the report is
written to ``--out`` after each one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

_IMG_S = re.compile(r"epoch (\d+)/\d+ step \d+/\d+ loss \S+ lr \S+ img/s (\d+)")


def job_sets(device: str, tiny: bool, epochs: int) -> list[str]:
    sets = [f"train.device={device}", f"train.epochs={epochs}", "train.schedule.warmup_epochs=0",
            "train.log_every_steps=10", "train.checkpoint_every_epochs=1000", "train.eval_every_epochs=1000",
            "train.data.name=synthetic-lt", "train.data.imbalance_factor=100", "slurm.tasks_per_node=1",
            "slurm.gpus_per_node=0", "slurm.time=00:30:00"]
    if tiny:
        sets += ["train.model.name=small_cnn", "train.batch_size=32", "train.data.max_per_class=60",
                 "train.data.image_size=8", "train.num_threads=1", "train.log_every_steps=2"]
    else:  # CIFAR-10-LT's size and the LDAM-DRW recipe's model, batch and precision
        sets += ["train.model.name=resnet32", "train.batch_size=128", "train.data.max_per_class=5000",
                 "train.amp=bf16", "train.channels_last=true", "train.tf32=true"]
    if device == "cuda":
        sets.append("train.cuda_graphs=on")  # every run, alone or packed, replays its captured step
    return sets


def run_variant(name: str, k: int, sets: list[str], work: Path, timeout_s: float, env: dict[str, str]) -> dict:
    from hpc_train.config import dump_yaml, resolve
    from hpc_train.local import launcher

    spec = resolve("digits_lt_demo", sets=sets).spec
    launches = []
    shutil.rmtree(work / name, ignore_errors=True)  # a rerun in the same --work starts afresh
    for i in range(k):
        run_dir = work / name / f"point-{i}"
        run_dir.mkdir(parents=True)
        point = replace(spec, train=replace(spec.train, seed=i))
        (run_dir / "job.yaml").write_text(dump_yaml(point))
        # The time limit is the variant's timeout; the preemption signal 5 s before it (slurm.signal_delay_s,
        # 120 s by default, would signal a run at once under a limit of 120 s or less).
        launches.append(replace(launcher.launch_for(point, run_dir), env={**env, **dict(point.slurm.env)},
                                time_limit_s=int(timeout_s), signal_delay_s=min(5, int(timeout_s) // 2)))
    started = time.monotonic()
    codes = launcher.run_launches(launches, sys.executable, os.getcwd(), pack=k)
    wall = time.monotonic() - started
    per_run = []
    for launch in launches:
        text = (Path(launch.run_dir) / "logs" / "rank-0.log").read_text(errors="replace")
        steady = [int(m.group(2)) for m in _IMG_S.finditer(text) if int(m.group(1)) > 1] or \
                 [int(m.group(2)) for m in _IMG_S.finditer(text)]
        per_run.append(statistics.median(steady) if steady else None)
    done = all(c == 0 for c in codes) and all(v is not None for v in per_run)
    return {"variant": name, "runs": k, "exit_codes": codes, "wall_s": round(wall, 1), "img_s_per_run": per_run,
            "aggregate_img_s": round(sum(per_run), 1) if done else None}


MPS_TIMEOUT_S = 20
"""How long the MPS control daemon may take to start or stop before the stage gives up on it."""


def mps_env(work: Path) -> tuple[dict[str, str] | None, str]:
    """Start an MPS control daemon for the stage: (its clients' environment, "started"), or (None, why not).
    Never waits more than :data:`MPS_TIMEOUT_S`."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return None, "not started: nvidia-cuda-mps-control not on PATH"
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(work / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(work / "mps-log")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    log = work / "mps-control.log"
    try:  # output to a file, not a pipe: a daemon that kept an inherited pipe open would make us wait on it
        with open(log, "w") as out:
            code = subprocess.run([control, "-d"], env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=MPS_TIMEOUT_S).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"not started: {control} -d: {type(exc).__name__}: {exc}"
    if code != 0:
        return None, f"not started: {control} -d exited {code}: {log.read_text(errors='replace').strip()[:300]}"
    return env, "started"


def stop_mps(env: dict[str, str]) -> str:
    try:
        code = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **env}, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=MPS_TIMEOUT_S).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"quit failed: {type(exc).__name__}: {exc}"
    return "stopped" if code == 0 else f"quit exited {code}"


def run_all(args: argparse.Namespace, work: Path, results: dict, write: Callable[[], None]) -> None:
    """alone, packed, then packed_mps under a daemon started just for it (skipped, saying why, when it cannot be
    started); the report is written after each variant."""
    sets = results["sets"]
    for name, k in (("alone", 1), ("packed", args.k)):
        results["variants"][name] = run_variant(name, k, sets, work, args.timeout_s, {})
        print(json.dumps(results["variants"][name]), flush=True)
        write()
    env, results["mps"] = mps_env(work) if args.device == "cuda" else (None, "not started: not on a GPU")
    if env is None:
        results["skipped"] = {"packed_mps": f"MPS {results['mps']}"}
        return
    try:
        results["variants"]["packed_mps"] = run_variant("packed_mps", args.k, sets, work, args.timeout_s, env)
        print(json.dumps(results["variants"]["packed_mps"]), flush=True)
    finally:
        results["mps_stop"] = stop_mps(env)
        write()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--k", type=int, default=4, help="runs packed on the GPU (default 4)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a small CPU smoke test of the stage")
    parser.add_argument("--timeout-s", type=float, default=60, help="per variant (default 60)")
    parser.add_argument("--work", type=Path, help="keep the runs (logs, run directories) here; default: a temporary "
                                                  "directory, removed at the end")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results: dict = {"k": args.k, "device": args.device, "sets": job_sets(args.device, args.tiny, args.epochs),
                     "variants": {}}

    def write() -> None:
        alone = results["variants"].get("alone", {}).get("aggregate_img_s")
        for name in ("packed", "packed_mps"):
            got = results["variants"].get(name, {}).get("aggregate_img_s")
            if alone and got:
                results[f"{name}_vs_alone"] = round(got / alone, 2)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")

    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        run_all(args, args.work, results, write)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-pack-") as tmp:
            run_all(args, Path(tmp), results, write)
    write()
    print(json.dumps({k: v for k, v in results.items() if k != "variants"}), flush=True)
    return 0 if all(v["aggregate_img_s"] for v in results["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
