"""6. GPU benchmark — the LDAM-DRW recipe's epoch on one GPU: eager, captured, compiled in capture, and the
reference loop, side by side in one process (part of ``benchmarks/gpu_session.sh``; ≤ 140 s by default) —
and, with ``--device cpu --count-ops``, the aten op count of the recipe's step (``benchmarks/op_count.py``).

    PYTHONPATH=. python3 benchmarks/gpu.py --out gpu.json                 # on the GPU machine
    PYTHONPATH=. python3 benchmarks/gpu.py --device cpu --tiny            # smoke test anywhere
    PYTHONPATH=. python3 benchmarks/gpu.py --device cpu --count-ops --out ops.json   # ops_per_step, ~10 s

Uses that machine's own python3 and torch: no install step, no network (our side needs numpy and PyYAML,
the reference torchvision and Pillow; a missing one is reported and its side skipped). One plain rank, no
process group, as ``python -m hpc_train.train`` runs on one GPU (no DDP wrapper at world size 1).

Data: CIFAR-shaped random pixels of CIFAR-10-LT's size (12,406 training images, a balanced 10,000-image
test split evaluated every epoch). Our variants are the recipe with ``amp: bf16`` + ``channels_last``:

* ``eager``: ``cuda_graphs: off`` — the eager step (the fallback path);
* ``captured``: ``cuda_graphs: auto`` — the whole step captured, one graph per batch shape;
* ``compiled_captured``: ``compile: true`` as well — the compiled step inside the capture.

Each of our epochs is :meth:`Trainer.fit_epoch` (train, the epoch-end agreement, evaluation, checkpoint in
the background). The reference is cifar_train.py's loop and ``validate()`` in fp32 with
``cudnn.benchmark``, torchvision DataLoaders with 2 workers.

Order (:func:`phases`): set-up and first (warm-up / capture) epoch of eager, captured and the reference,
then their timed epochs interleaved (ABBA); only then, and only with ``--compile-reserve-s`` of the budget
left, the compiled variant (its first epoch holds the cold compile, about a minute on an H200), timed in
rounds interleaved with the captured one. After every stage one JSON line goes to stdout (``{"stage":
...}``) and the report so far to ``--out``, so a timeout still leaves every figure measured until then.
The final report: training images/s of each side, the ratios to the reference, epoch wall times, and a
200-epoch projection (set-up + first epoch + 199 × the median epoch). Goals (issue 10): the recipe
≤ 60 s, ours ≥ 5× the reference.
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
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

EPOCHS_PROJECTED = 200
VARIANTS = {"eager": {"cuda_graphs": False}, "captured": {"cuda_graphs": "auto"},
            "compiled_captured": {"cuda_graphs": "auto", "compile": True}}


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _environment(device) -> dict[str, Any]:
    import torch

    modules = {m: _have(m) for m in ("numpy", "yaml", "torchvision", "PIL")}
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
                            "cpu_cores": os.cpu_count(), "modules": modules}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({"gpu": p.name, "gpu_memory_gb": round(p.total_memory / 2**30, 1), "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version(), "bf16_supported": torch.cuda.is_bf16_supported()})
    return info


class Clock:
    """Wall time that waits for the GPU's queue first, so it times the work and not its launch."""

    def __init__(self, device) -> None:
        import torch

        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()


class Ours:
    """One of our variants: a Trainer on the recipe, driven through its public API."""

    def __init__(self, name: str, data, device, run_dir: Path, *, amp: str, **train: Any) -> None:
        from benchmarks import ours

        self.name = name
        spec = ours.recipe_spec(device=device.type, amp=amp, channels_last=True, eval_batch_size=10_000,
                                keep_checkpoints=1, log_every_steps=50, **train)
        self.trainer = ours.build_trainer(spec, data, run_dir)
        self.trainer.clock.begin()

    def epoch(self, clock: Clock) -> dict[str, Any]:
        t = self.trainer
        train_before, eval_before = t.clock.seconds("train"), t.clock.seconds("eval")
        start = clock.now()
        t.fit_epoch()
        end = clock.now()
        train_s, eval_s = t.clock.seconds("train") - train_before, t.clock.seconds("eval") - eval_before
        return {"train_s": train_s, "eval_s": eval_s, "epoch_s": end - start, "images": len(t.data.train),
                "eval_images": len(t.data.test),
                "top1": t.last["top1"] if t.last else None,
                "graphs": sorted(t.runner.graphs) if t.runner else [],
                "fell_back": t.runner.failed if t.runner else None}


class Reference:
    def __init__(self, data, device, *, workers: int, log_dir: Path) -> None:
        import torch

        from benchmarks import ours, reference
        from hpc_train.train.model.losses import build_loss
        from hpc_train.train.model.models import init_model

        self.name, self.device, self.reference, self.workers = "reference", device, reference, workers
        t = self.cfg = ours.recipe_spec(device=device.type).train
        torch.backends.cudnn.benchmark = True  # cifar_train.py sets it
        self.model = init_model(t, data).to(device)
        self.criterion = build_loss(t.loss, [int(c) for c in data.train_counts]).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), t.optim.lr, momentum=t.optim.momentum,
                                         weight_decay=t.optim.weight_decay)
        self.train_set = reference.CifarLikeDataset(data.train.images, data.train.labels, reference.train_transform())
        self.test_set = reference.CifarLikeDataset(data.test.images, data.test.labels, reference.eval_transform())
        self.log = open(log_dir / "reference-log_train.csv", "w")
        self.epoch_index = 0

    def epoch(self, clock: Clock) -> dict[str, Any]:
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
                "images": len(self.train_set), "eval_images": len(self.test_set),
                "balanced": sum(per_class) / len(per_class)}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(report: dict[str, Any], setup_s: dict[str, float], first: dict[str, dict],
              epochs: dict[str, list]) -> None:
    """Fill in ``sides``, ``ratios``, ``projected_200_epochs_s`` and ``goals`` from what was measured."""
    sides: dict[str, Any] = {}
    for name, runs in epochs.items():
        if not runs:
            continue
        epoch_s = _median([e["epoch_s"] for e in runs])
        sides[name] = {
            "train_images_per_s": _median([e["images"] / e["train_s"] for e in runs]),
            "eval_images_per_s": _median([e["eval_images"] / e["eval_s"] for e in runs if e["eval_s"] > 0]),
            "epoch_s_median": epoch_s, "train_s_median": _median([e["train_s"] for e in runs]),
            "eval_s_median": _median([e["eval_s"] for e in runs]), "epochs_timed": len(runs),
            "setup_s": setup_s[name], "first_epoch_s": first[name]["epoch_s"],
            "projected_200_epochs_s": setup_s[name] + first[name]["epoch_s"] + (EPOCHS_PROJECTED - 1) * epoch_s,
            **({k: runs[-1].get(k) for k in ("graphs", "fell_back")} if name != "reference" else {}),
        }
    report["sides"] = sides
    ref = sides.get("reference", {}).get("train_images_per_s")
    report["ratios"] = {f"{n}_vs_reference": s["train_images_per_s"] / ref for n, s in sides.items()
                        if n != "reference" and ref}
    ours = {n: s["projected_200_epochs_s"] for n, s in sides.items() if n != "reference"}
    if ours:
        best = min(ours, key=ours.get)
        report["projected_200_epochs_s"] = {"best": ours[best], "variant": best}
    if report["environment"]["device"].startswith("cuda") and not report["tiny"] and ours:
        report["goals"] = {"projected_200_epochs_s <= 60": min(ours.values()) <= 60,
                           "ours_vs_reference >= 5": bool(report["ratios"]) and max(report["ratios"].values()) >= 5}
    else:
        report["goals"] = "not applicable: a smoke test (CPU or --tiny), not the GPU measurement"


def phases(wanted: list[str]) -> list[list[str]]:
    """The order of the sides: the reference, eager and captured first (set-up, first epoch, then their timed
    rounds interleaved), the compiled variant last — its cold compile (about a minute) must not keep the
    others from being timed."""
    first = [n for n in wanted if "compiled" not in n] + ["reference"]
    return [first, [n for n in wanted if "compiled" in n]]


class Bench:
    """The report and its stages: after every stage one JSON line on stdout and everything measured so far
    in ``--out``, so a timeout still leaves every figure measured until then."""

    def __init__(self, args: argparse.Namespace, device) -> None:
        self.args, self.device, self.began = args, device, time.perf_counter()
        self.clock = Clock(device)
        self.report: dict[str, Any] = {"measured": True, "environment": _environment(device), "tiny": args.tiny,
                                       "epochs_projected": EPOCHS_PROJECTED, "stages": [], "skipped": {}}
        self.sides: dict[str, Any] = {}
        self.setup_s: dict[str, float] = {}
        self.first: dict[str, dict] = {}
        self.epochs: dict[str, list] = {}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.began)

    def stage(self, name: str, **figures: Any) -> None:
        entry = {"stage": name, "at_s": round(time.perf_counter() - self.began, 2), **figures}
        self.report["stages"].append(entry)
        summarise(self.report, self.setup_s, self.first, self.epochs)
        self.report["wall_s"] = time.perf_counter() - self.began
        print(json.dumps(entry, default=str), flush=True)
        if self.args.out:
            self.args.out.write_text(json.dumps(self.report, indent=2, default=str) + "\n", encoding="utf-8")

    def start(self, name: str, make: Callable[[], Any]) -> None:
        """Set up one side and run its first (warm-up / capture / compile) epoch."""
        start = self.clock.now()
        self.sides[name] = make()
        self.setup_s[name] = self.clock.now() - start
        self.first[name] = self.sides[name].epoch(self.clock)
        self.epochs[name] = []
        self.stage(f"first_epoch:{name}", setup_s=round(self.setup_s[name], 2), **self.first[name])

    def rounds(self, names: list[str], label: str = "") -> None:
        """Timed epochs of ``names``, one each per round, in ABBA order."""
        from benchmarks.common import abba_order

        for r, order in enumerate(abba_order(names, self.args.rounds)):
            if self.left() < 3:
                self.report["skipped"][f"rounds:{label or 'first'}"] = f"after {r} rounds (time budget)"
                return
            for name in order:
                self.epochs[name].append(self.sides[name].epoch(self.clock))
            self.stage(f"round:{label}{r + 1}", **{n: round(self.epochs[n][-1]["epoch_s"], 4) for n in names})


def _run_sides(bench: Bench, data, work: Path) -> None:
    args, device, skipped = bench.args, bench.device, bench.report["skipped"]
    first, compiled = phases([v for v in args.variants.split(",") if v])
    for name in first + compiled:
        if name != "reference" and device.type != "cuda" and name != "eager":
            skipped[name] = "CUDA graphs and compile are exercised on the GPU only (CPU smoke test)"
    for name in first:
        if name in skipped:
            continue
        if name == "reference":
            missing = [m for m in ("torchvision", "PIL") if not _have(m)]
            if missing or bench.left() <= 15:
                skipped[name] = f"needs {missing}, not installed here" if missing else "time budget"
            else:
                bench.start(name, lambda: Reference(data, device, workers=args.ref_workers, log_dir=work))
        elif bench.left() < 10:
            skipped[name] = "time budget"
        else:
            bench.start(name, lambda n=name: Ours(n, data, device, work / n, amp="bf16", **VARIANTS[n]))
    bench.rounds(list(bench.sides))
    for name in compiled:
        if name in skipped:
            continue
        if bench.left() < args.compile_reserve_s:
            skipped[name] = (f"time budget: {bench.left():.0f} s left, {args.compile_reserve_s:.0f} s needed "
                             "(--compile-reserve-s: a cold compile takes about a minute)")
            continue
        bench.start(name, lambda n=name: Ours(n, data, device, work / n, amp="bf16", **VARIANTS[n]))
        bench.rounds([name] + (["captured"] if "captured" in bench.sides else []), label=f"{name}:")


def count_ops(args: argparse.Namespace) -> int:
    """``--count-ops``: the op count of the recipe's step (benchmarks/op_count.py), on the CPU."""
    if args.device != "cpu":
        print("gpu.py: --count-ops counts on the CPU: add --device cpu", file=sys.stderr)
        return 2
    from benchmarks import op_count

    report = op_count.count_recipe_step(tiny=args.tiny)
    print(op_count.table(report), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0 if report["deterministic"] else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a few hundred images: prove the script runs end to end")
    parser.add_argument("--budget-s", type=float, default=140.0, help="start no new stage after this (default 140)")
    parser.add_argument("--compile-reserve-s", type=float, default=80.0,
                        help="start the compiled variant only with this much budget left (default 80)")
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per side, interleaved (default 3)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"ours to run (default {','.join(VARIANTS)})")
    parser.add_argument("--ref-workers", type=int, default=2, help="reference DataLoader workers (default 2)")
    parser.add_argument("--count-ops", action="store_true",
                        help="instead: count the aten ops of one training step of the recipe (with --device cpu)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON report here (after every stage)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.count_ops:
        return count_ops(args)
    import torch

    from benchmarks.common import cifar_shaped_lt

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"measured": False, "reason": "no CUDA device visible to torch"}), flush=True)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    missing_ours = [m for m in ("numpy", "yaml") if not _have(m)]
    if missing_ours:
        print(json.dumps({"measured": False, "reason": f"our trainer needs {missing_ours}, not installed here"}))
        return 2
    bench = Bench(args, device)
    t0 = time.perf_counter()
    data = (cifar_shaped_lt(30, imbalance_factor=10, test_per_class=5) if args.tiny  # 117 + 50 images
            else cifar_shaped_lt(5000, test_per_class=1000))
    bench.report["data"] = {"train_images": len(data.train), "test_images": len(data.test)}
    work = Path(tempfile.mkdtemp(prefix="hpc-train-gpu-bench-"))
    bench.stage("data", make_s=round(time.perf_counter() - t0, 2))
    _run_sides(bench, data, work)
    if device.type == "cuda":
        bench.report["peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    bench.stage("done")
    print(json.dumps(bench.report, indent=2, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
