"""GPU packing benchmark (``--pack K``): aggregate training img/s of K sweep points packed on one GPU
against one run alone — a prepared stage for a machine with an NVIDIA GPU (about 3 minutes on one H200).

    PYTHONPATH=. python3 benchmarks/gpu_pack.py --out gpu_pack.json            # on the GPU machine
    PYTHONPATH=. python3 benchmarks/gpu_pack.py --device cpu --tiny            # smoke test anywhere (~20 s)

Each variant is the trainer as ``--pack`` runs it: separate processes, one rank each, started by the pack
runner (:func:`hpc_train.local.launcher.run_launches`), each with its own run directory — the CIFAR-10-LT-sized
LDAM-DRW recipe (ResNet-32, batch 128, bf16 + channels_last, synthetic CIFAR-shaped data). Variants, each
under its own timeout, their JSON printed as each ends (a slow one costs only itself):

* ``alone``: one run (with the captured step, ``train.cuda_graphs: on``, where this trainer has it);
* ``packed``: K runs at once, plain: separate processes only time-slice a GPU;
* ``packed_mps``: the same under an MPS daemon started for the stage (``nvidia-cuda-mps-control``), which
  lets the K processes' kernels overlap on the GPU.

Reported per variant: each run's steady-state training img/s (the median of its progress lines after the
first epoch), their sum (aggregate), and aggregate ÷ alone. Goal: packed (K = 4) >= 2x alone.
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
    for i in range(k):
        run_dir = work / name / f"point-{i}"
        run_dir.mkdir(parents=True)
        point = replace(spec, train=replace(spec.train, seed=i))
        (run_dir / "job.yaml").write_text(dump_yaml(point))
        launches.append(replace(launcher.launch_for(point, run_dir), env={**env, **dict(point.slurm.env)},
                                time_limit_s=int(timeout_s)))
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


def mps_env(work: Path) -> tuple[dict[str, str] | None, str]:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return None, "nvidia-cuda-mps-control not on PATH"
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(work / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(work / "mps-log")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    result = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True)
    return (env, "started") if result.returncode == 0 else (None, f"mps daemon: {result.stderr.strip()}")


def stop_mps(env: dict[str, str]) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **env}, text=True,
                   capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--k", type=int, default=4, help="runs packed on the GPU (default 4)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a small CPU smoke test of the stage")
    parser.add_argument("--timeout-s", type=float, default=150, help="per variant")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sets = job_sets(args.device, args.tiny, args.epochs)
    results: dict = {"k": args.k, "device": args.device, "sets": sets, "variants": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-pack-") as tmp:
        work = Path(tmp)
        variants = [("alone", 1, {}), ("packed", args.k, {})]
        env, note = mps_env(work) if args.device == "cuda" else (None, "not on a GPU")
        results["mps"] = note
        if env is not None:
            variants.append(("packed_mps", args.k, env))
        try:
            for name, k, extra in variants:
                result = run_variant(name, k, sets, work, args.timeout_s, extra)
                results["variants"][name] = result
                print(json.dumps(result), flush=True)
        finally:
            if env is not None:
                stop_mps(env)
    alone = results["variants"]["alone"]["aggregate_img_s"]
    for name in ("packed", "packed_mps"):
        got = results["variants"].get(name, {}).get("aggregate_img_s")
        if alone and got:
            results[f"{name}_vs_alone"] = round(got / alone, 2)
    print(json.dumps({k: v for k, v in results.items() if k != "variants"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(v["aggregate_img_s"] for v in results["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
