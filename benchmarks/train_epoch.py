"""3. One training epoch on the CPU: ResNet-32 (cosine classifier, LDAM loss), batch 128, SGD, on
CIFAR-shaped long-tailed data — our trainer (its batched data path included) against the reference
loop of ``reference.py`` (cifar_train.py's loop, torchvision DataLoader with 2 workers).

Each side runs in its own long-lived process (so its peak memory is its own), built once and warmed up
with one forward/backward pass; the parent then asks the sides for one epoch each in ABBA order, round
after round, so they never run at the same time. Same data, same initial weights, same loss and
optimizer settings; the reference starts a new pair of DataLoader workers every epoch, as
cifar_train.py does. Our variants: ``ours`` (the recipe as written: fp32, NCHW),
``ours_channels_last`` (the recipe with ``train.channels_last: true``, what we run on CPUs) and
``ours_heartbeat`` (that one with the progress heartbeat on, as a launch under ``slurm.hang_timeout_s=20`` has it:
a record written at most every second; refreshed at every step, ten times as often as by default; issue 18). The heartbeat side also times every heartbeat call itself, so
its cost is measured twice: as the ratio of the two sides' epochs, and directly, as its share of the epoch.
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
            "ours_heartbeat": ["--side", "ours", "--channels-last", "--heartbeat"], "reference": ["--side", "reference"]}


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
        if "heartbeat_s" in epochs[name][0]:
            out[f"{name}_cost"] = spread([e["heartbeat_s"] / e["wall_s"] for e in epochs[name]])
            out[f"{name}_writes_per_epoch"] = spread([float(e["heartbeat_writes"]) for e in epochs[name]])
    if "ours_heartbeat" in procs and "ours_channels_last" in procs:  # same recipe, side by side: the heartbeat's cost
        out["heartbeat_step_ratio"] = (out["ours_heartbeat_epoch_wall_s"]["median"]
                                       / out["ours_channels_last_epoch_wall_s"]["median"])
    ref = out["reference_images_per_s"]["median"]
    for name in procs:
        if name not in ("reference", "ours_heartbeat") and "reference" in procs:
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
    # The heartbeat side refreshes it at every step (preempt_check_every_steps=1: its worst case; the default is 10).
    spec = ours.recipe_spec(device="cpu", channels_last=args.channels_last,
                            **({"preempt_check_every_steps": 1} if args.heartbeat else {}))
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    if args.side == "ours":
        trainer = ours.build_trainer(spec, data, tmp / "run")
        spent = _heartbeat_timer(tmp / "run") if args.heartbeat else None
        x, y, _ = next(trainer.feed.train_batches(trainer.sampler, 0, trainer.cfg.batch_size))
        trainer.criterion(trainer.train_model(x), y).backward()  # warm-up: kernels, allocator
        trainer.optimizer.zero_grad(set_to_none=True)
        steps = trainer.steps_per_epoch

        def epoch(_: dict) -> dict:
            with PssSampler() as pss:
                elapsed = timer()
                images = ours.train_one_epoch(trainer)
                wall_s = elapsed()
            out = {"wall_s": wall_s, "images": images, "peak_pss_mb": pss.peak_mb}
            if spent is not None:
                out.update(heartbeat_s=spent["s"], heartbeat_writes=spent["writes"])
                spent.update(s=0.0, writes=0)
            return out
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


def _heartbeat_timer(run_dir: Path) -> dict[str, Any]:
    """Start this process's heartbeat (a record at most every second) and time every call the trainer makes."""
    import os
    import time

    from hpc_train.rank import heartbeat

    os.environ[heartbeat.HANG_TIMEOUT_ENV] = "20"
    beat = heartbeat.start(run_dir, 0)
    spent: dict[str, Any] = {"s": 0.0, "writes": 0}
    original = beat.beat

    def timed(**kwargs: Any) -> bool:
        t0 = time.perf_counter()
        wrote = original(**kwargs)
        spent["s"] += time.perf_counter() - t0
        spent["writes"] += int(wrote)
        return wrote

    beat.beat = timed  # type: ignore[method-assign]
    return spent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("ours", "reference"), required=True)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--heartbeat", action="store_true")
    parser.add_argument("--max-per-class", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    _worker(parser.parse_args(argv))


if __name__ == "__main__":
    main()
