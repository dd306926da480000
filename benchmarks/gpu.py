"""6. GPU benchmark — one prepared script for a machine with an NVIDIA GPU (at most ~5 minutes).

    PYTHONPATH=. python3 benchmarks/gpu.py --out gpu.json              # on the GPU machine
    PYTHONPATH=. python3 benchmarks/gpu.py --device cpu --tiny         # smoke test anywhere (~1 min)

Uses that machine's own python3 and torch: no install step, no network, nothing that needs submitit
(our side needs numpy and PyYAML, the reference torchvision and Pillow; a missing one is reported and
its side skipped). On one GPU it opens a one-rank NCCL process group, so our trainer runs wrapped in DDP
and evaluates with its all-reduce, as a job does.

Measured, interleaved epoch by epoch on the same GPU, CIFAR-shaped synthetic data of CIFAR-10-LT's size
(12,406 training images per epoch, a balanced 10,000-image test split evaluated every epoch):

* ours, the LDAM-DRW recipe (ResNet-32, batch 128) with ``amp: bf16`` + ``channels_last``, eager and
  with ``compile: true``, and as written (fp32, NCHW: the reference's precision); each epoch is what
  ``Trainer.fit`` does per epoch: train, evaluate, record, checkpoint, the preemption check;
* the reference: cifar_train.py's loop and ``validate()`` in fp32 with ``cudnn.benchmark`` (as the
  script sets it), torchvision DataLoaders with 2 workers for training and evaluation.

Reported: training images/s of each, the ratio, epoch wall times (train + eval), and the wall time of a
200-epoch run projected from the timed whole epochs: one-time set-up (data upload, model, compile) +
200 × median epoch. Goals: projected <= 180 s and ours >= 5x the reference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

EPOCHS_PROJECTED = 200


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _environment(device) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "device": str(device), "cpu_cores": os.cpu_count(),
                            "modules": {m: _have(m) for m in ("numpy", "yaml", "torchvision", "PIL")}}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({"gpu": p.name, "gpu_memory_gb": round(p.total_memory / 2**30, 1), "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version(), "nccl": str(torch.cuda.nccl.version()),
                     "bf16_supported": torch.cuda.is_bf16_supported()})
    return info


class Clock:
    """Wall time that waits for the GPU's queue first, so it times the work and not its launch."""

    def __init__(self, device) -> None:
        import torch

        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()


# --------------------------------------------------------------------------------------------------
# The two sides
# --------------------------------------------------------------------------------------------------


class Ours:
    def __init__(self, name: str, data, device, run_dir: Path, *, compile_: bool, amp: str,
                 channels_last: bool) -> None:
        from benchmarks import ours

        self.name = name
        spec = ours.recipe_spec(device=device.type, amp=amp, channels_last=channels_last, compile=compile_,
                                eval_batch_size=500, keep_checkpoints=1)
        self.trainer = ours.build_trainer(spec, data, run_dir, distributed=True)

    def epoch(self, clock: Clock) -> dict[str, float]:
        t = self.trainer
        start = clock.now()
        images = len(t.data.train) - len(t.data.train) % t.ctx.world_size
        t._train_epoch()
        trained = clock.now()
        t._evaluate_and_record()  # fit()'s epoch: evaluate + record, checkpoint, preemption check
        t.save_checkpoint()
        t._check_preemption()
        end = clock.now()
        return {"train_s": trained - start, "eval_s": end - trained, "epoch_s": end - start, "images": images,
                "top1": t.last["top1"] if t.last else None}


class Reference:
    def __init__(self, data, device, *, workers: int, log_dir: Path) -> None:
        import torch

        from hpc_train.train.engine import init_model
        from hpc_train.train.losses import build_loss

        from benchmarks import ours, reference

        self.name, self.device, self.reference, self.workers = "reference", device, reference, workers
        spec = ours.recipe_spec(device=device.type)
        t = self.cfg = spec.train
        torch.backends.cudnn.benchmark = True  # cifar_train.py sets it
        self.model = init_model(t, data).to(device)
        self.criterion = build_loss(t.loss, [int(c) for c in data.train_counts]).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), t.optim.lr, momentum=t.optim.momentum,
                                         weight_decay=t.optim.weight_decay)
        self.train_set = reference.CifarLikeDataset(data.train.images, data.train.labels, reference.train_transform())
        self.test_set = reference.CifarLikeDataset(data.test.images, data.test.labels, reference.eval_transform())
        self.log = open(log_dir / "reference-log_train.csv", "w")
        self.epoch_index = 0

    def epoch(self, clock: Clock) -> dict[str, float]:
        import torch

        ref = self.reference
        start = clock.now()
        ref.adjust_learning_rate(self.optimizer, self.epoch_index, self.cfg.optim.lr)
        self.criterion.set_epoch(self.epoch_index)
        loader = ref.train_loader(self.train_set, batch_size=self.cfg.batch_size, workers=self.workers)
        ref.train_epoch(loader, self.model, self.criterion, self.optimizer, self.epoch_index, device=self.device,
                        log=self.log)
        trained = clock.now()
        val = torch.utils.data.DataLoader(self.test_set, batch_size=100, shuffle=False, num_workers=self.workers,
                                          pin_memory=self.device.type == "cuda")
        per_class = ref.validate(val, self.model, device=self.device)
        end = clock.now()
        self.epoch_index += 1
        return {"train_s": trained - start, "eval_s": end - trained, "epoch_s": end - start,
                "images": len(self.train_set), "balanced": sum(per_class) / len(per_class)}


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a few hundred images: prove the script runs end to end")
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting new work after this (default 270)")
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per side, interleaved (default 3)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--ref-workers", type=int, default=2, help="reference DataLoader workers (default 2)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    left = lambda: args.budget_s - (time.perf_counter() - began)  # noqa: E731

    import torch
    import torch.distributed as dist

    from benchmarks.common import cifar_shaped_lt, free_port

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"measured": False, "reason": "no CUDA device visible to torch"}), flush=True)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    report: dict[str, Any] = {"measured": True, "environment": _environment(device), "tiny": args.tiny,
                              "epochs_projected": EPOCHS_PROJECTED, "sides": {}, "skipped": {}}
    missing_ours = [m for m in ("numpy", "yaml") if not _have(m)]
    missing_ref = [m for m in ("torchvision", "PIL") if not _have(m)]
    if missing_ours:
        report.update(measured=False, reason=f"our trainer needs {missing_ours}, not installed here")
        print(json.dumps(report, indent=2), flush=True)
        return 2

    # One-rank process group on the device's backend: DDP wrapping and the evaluation all-reduce run
    # through NCCL (gloo on the CPU) as in a job.
    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    dist.init_process_group(backend, rank=0, world_size=1)
    probe = torch.ones(4, device=device)
    dist.all_reduce(probe)
    report["backend"] = backend

    t0 = time.perf_counter()
    if args.tiny:  # 117 training images (one step of 128), 50 test images: the code path, not a figure
        data = cifar_shaped_lt(30, imbalance_factor=10, test_per_class=5)
    else:
        data = cifar_shaped_lt(5000, test_per_class=1000)
    report["data"] = {"train_images": len(data.train), "test_images": len(data.test),
                      "make_s": time.perf_counter() - t0}
    work = Path(tempfile.mkdtemp(prefix="hpc-train-gpu-bench-"))
    clock = Clock(device)

    # (name, amp, channels_last, compile). The compiled variant goes last: if compiling is slow, the
    # eager figures and the reference are already in hand when the budget runs out.
    variants: list[tuple[str, str, bool, bool]] = [("ours_bf16_cl", "bf16", True, False)]
    if not args.tiny:  # the plain fp32 path is the one every CPU test runs; the smoke test skips it
        variants.append(("ours_fp32", "off", False, False))
    if not args.no_compile and device.type == "cuda":
        variants.append(("ours_bf16_cl_compile", "bf16", True, True))
    elif not args.no_compile:
        report["skipped"]["ours_bf16_cl_compile"] = "compile is exercised on the GPU only (CPU smoke test)"
    sides: dict[str, Any] = {}
    setup_s: dict[str, float] = {}
    warmup: dict[str, dict[str, float]] = {}

    def start_ours(name: str, amp: str, channels_last: bool, compile_: bool) -> None:
        if left() < (120 if compile_ else 60):
            report["skipped"][name] = "time budget"
            return
        start = clock.now()
        sides[name] = Ours(name, data, device, work / name, compile_=compile_, amp=amp, channels_last=channels_last)
        setup_s[name] = clock.now() - start
        warmup[name] = sides[name].epoch(clock)  # compiles here

    for variant in variants:
        if not variant[3]:
            start_ours(*variant)
    if missing_ref:
        report["skipped"]["reference"] = f"needs {missing_ref}, not installed here"
    elif left() > 30:
        start = clock.now()
        sides["reference"] = Reference(data, device, workers=args.ref_workers, log_dir=work)
        setup_s["reference"] = clock.now() - start
        warmup["reference"] = sides["reference"].epoch(clock)
    else:
        report["skipped"]["reference"] = "time budget"
    for variant in variants:
        if variant[3]:
            start_ours(*variant)

    epochs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    peak_mem: dict[str, float] = {}
    names = list(sides)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        if r >= 1 and left() < 10:
            report["skipped"]["rounds_after"] = f"{r} rounds (time budget)"
            break
        for name in order:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            epochs[name].append(sides[name].epoch(clock))
            if device.type == "cuda":
                peak_mem[name] = max(peak_mem.get(name, 0.0), torch.cuda.max_memory_allocated(device) / 2**20)

    for name, runs in epochs.items():
        train_ips = [e["images"] / e["train_s"] for e in runs]
        epoch_s = _median([e["epoch_s"] for e in runs])
        one_time = setup_s[name] + max(0.0, warmup[name]["epoch_s"] - (epoch_s or 0.0))
        sides_report = {
            "train_images_per_s": _median(train_ips), "train_images_per_s_all": train_ips,
            "epoch_s_median": epoch_s, "train_s_median": _median([e["train_s"] for e in runs]),
            "eval_s_median": _median([e["eval_s"] for e in runs]), "epochs_timed": len(runs),
            "setup_s": setup_s[name], "first_epoch_s": warmup[name]["epoch_s"],
            "one_time_s": one_time,
            "projected_200_epochs_s": one_time + EPOCHS_PROJECTED * epoch_s if epoch_s else None,
        }
        if name in peak_mem:
            sides_report["peak_gpu_memory_mb"] = peak_mem[name]
        report["sides"][name] = sides_report
    ref = report["sides"].get("reference", {}).get("train_images_per_s")
    best = min((s["projected_200_epochs_s"], n) for n, s in report["sides"].items() if n != "reference"
               and s["projected_200_epochs_s"])
    report["ratios"] = {f"{n}_vs_reference": s["train_images_per_s"] / ref
                        for n, s in report["sides"].items() if n != "reference" and ref}
    report["projected_200_epochs_s"] = {"best": best[0], "variant": best[1]}
    if device.type == "cuda" and not args.tiny:
        report["goals"] = {"projected_200_epochs_s <= 180": best[0] <= 180,
                           "ours_vs_reference >= 5": bool(report["ratios"]) and max(report["ratios"].values()) >= 5}
    else:
        report["goals"] = "not applicable: a smoke test (CPU or --tiny), not the GPU measurement"
    report["wall_s"] = time.perf_counter() - began
    dist.destroy_process_group()
    text = json.dumps(report, indent=2)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
