"""3. One training epoch on the CPU: ResNet-32 (cosine classifier, LDAM loss), batch 128, SGD, on
CIFAR-shaped long-tailed data — our trainer (its batched data path included) against the reference
loop of ``reference.py`` (cifar_train.py's loop, torchvision DataLoader with 2 workers).

Each side runs in its own long-lived process (so its peak memory is its own), built once and warmed up
with one forward/backward pass; the parent then asks the sides for one epoch each in ABBA order, round
after round, so they never run at the same time. Same data, same initial weights, same loss and
optimizer settings; the reference starts a new pair of DataLoader workers every epoch, as
cifar_train.py does. Our variants: ``ours`` (the recipe as written: fp32, NCHW) and
``ours_channels_last`` (the recipe with ``train.channels_last: true``, what we run on CPUs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a worker script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from benchmarks.common import PssSampler, Worker, abba_order, cifar_shaped_lt, peak_rss_mb, serve, spread, timer  # noqa: E402

VARIANTS = {"ours": ["--side", "ours"], "ours_channels_last": ["--side", "ours", "--channels-last"],
            "reference": ["--side", "reference"]}


def run(*, rounds: int, max_per_class: int, variants: tuple[str, ...] = tuple(VARIANTS), workers: int = 2,
        log_dir: Path | None = None) -> dict[str, Any]:
    common = ["-m", "benchmarks.train_epoch", "--max-per-class", str(max_per_class), "--workers", str(workers)]
    procs = {name: Worker([*common, *VARIANTS[name]], log=(log_dir / f"train_epoch-{name}.log") if log_dir else None)
             for name in variants}
    try:
        ready = {name: w.read() for name, w in procs.items()}  # start-up and warm-up, in parallel, not timed
        epochs: dict[str, list[dict[str, Any]]] = {name: [] for name in procs}
        for order in abba_order(list(procs), rounds):
            for name in order:
                epochs[name].append(procs[name].ask({"cmd": "epoch"}))
    finally:
        final = {}
        for name, w in procs.items():
            try:
                final[name] = w.close()
            except Exception:  # noqa: BLE001 - a dead worker already raised above
                w.proc.kill()
    out: dict[str, Any] = {"rounds": rounds, "train_images": ready[variants[0]]["train_images"],
                           "steps_per_epoch": ready[variants[0]]["steps_per_epoch"], "batch": 128,
                           "reference_workers": workers}
    for name in procs:
        out[f"{name}_images_per_s"] = spread([e["images"] / e["wall_s"] for e in epochs[name]])
        out[f"{name}_epoch_wall_s"] = spread([e["wall_s"] for e in epochs[name]])
        out[f"{name}_peak_rss_mb"] = final[name]["peak_rss_mb"]
        out[f"{name}_peak_pss_with_workers_mb"] = max(e["peak_pss_mb"] for e in epochs[name])
        out[f"{name}_torch_threads"] = ready[name]["torch_threads"]
        out[f"{name}_setup_s"] = ready[name]["setup_s"]
    ref = out["reference_images_per_s"]["median"]
    for name in procs:
        if name != "reference" and "reference" in procs:
            out[f"speedup_{name}"] = out[f"{name}_images_per_s"]["median"] / ref
    return out


# --------------------------------------------------------------------------------------------------
# The worker processes
# --------------------------------------------------------------------------------------------------


def _worker(args: argparse.Namespace) -> None:
    setup = timer()
    import torch

    from benchmarks import ours, reference
    from hpc_train.train.model.losses import build_loss
    from hpc_train.train.model.models import init_model

    data = cifar_shaped_lt(args.max_per_class, test_per_class=1)
    spec = ours.recipe_spec(device="cpu", channels_last=args.channels_last)
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    if args.side == "ours":
        trainer = ours.build_trainer(spec, data, tmp / "run")
        x, y, _ = next(trainer.feed.train_batches(trainer.sampler, 0, trainer.cfg.batch_size))
        trainer.criterion(trainer.train_model(x), y).backward()  # warm-up: kernels, allocator
        trainer.optimizer.zero_grad(set_to_none=True)
        steps = trainer.steps_per_epoch

        def epoch(_: dict) -> dict:
            with PssSampler() as pss:
                elapsed = timer()
                images = ours.train_one_epoch(trainer)
                wall_s = elapsed()
            return {"wall_s": wall_s, "images": images, "peak_pss_mb": pss.peak_mb}
    else:
        t = spec.train
        model = init_model(t, data)
        counts = [int(c) for c in data.train_counts]
        criterion = build_loss(t.loss, counts)
        optimizer = torch.optim.SGD(model.parameters(), t.optim.lr, momentum=t.optim.momentum,
                                    weight_decay=t.optim.weight_decay)
        dataset = reference.CifarLikeDataset(data.train.images, data.train.labels, reference.train_transform())
        x = torch.stack([dataset[i][0] for i in range(t.batch_size)])
        y = torch.tensor(dataset.targets[:t.batch_size])
        criterion(model(x), y).backward()  # the same warm-up
        optimizer.zero_grad()
        log = open(tmp / "log_train.csv", "w")
        steps = -(-len(dataset) // t.batch_size)
        counter = {"epoch": 0}

        def epoch(_: dict) -> dict:
            with PssSampler() as pss:
                elapsed = timer()
                reference.adjust_learning_rate(optimizer, counter["epoch"], t.optim.lr)
                criterion.set_epoch(counter["epoch"])  # cifar_train.py rebuilds its criterion (DRW) every epoch
                loader = reference.train_loader(dataset, batch_size=t.batch_size, workers=args.workers)
                reference.train_epoch(loader, model, criterion, optimizer, counter["epoch"],
                                      device=torch.device("cpu"), log=log)
                wall_s = elapsed()
            counter["epoch"] += 1
            return {"wall_s": wall_s, "images": len(dataset), "peak_pss_mb": pss.peak_mb}

    def quit_(_: dict) -> dict:
        return {"peak_rss_mb": peak_rss_mb()}

    serve({"epoch": epoch, "quit": quit_}, {"train_images": len(data.train), "steps_per_epoch": steps,
                                           "torch_threads": torch.get_num_threads(), "setup_s": setup()})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("ours", "reference"), required=True)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--max-per-class", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    _worker(parser.parse_args(argv))


if __name__ == "__main__":
    main()
