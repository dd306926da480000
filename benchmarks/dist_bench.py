"""4 and 5. Distributed evaluation and DDP overhead on CPU with gloo, our trainer at world size 1 and 2.

* Exact evaluation: the same weights evaluated on the same balanced test split by 1 rank and by 2 ranks
  (each an unpadded strided shard, per-class ``[correct, count]`` summed in one all-reduce): the
  per-class accuracies must be identical; the figure is the evaluation's wall time at 2 ranks vs 1.
* DDP overhead: a training step of the LDAM-DRW recipe (ResNet-32, global batch 128) as 2 gloo ranks ×
  64 against 1 rank × 128, DDP's default buckets. Both use the machine's cores: 1 rank with all of them
  as threads, 2 ranks with half each (what ``configure_backends`` gives every rank).

Every launch is fresh processes (torchrun-style variables, as ``hpc_train.dist`` reads them); world
sizes alternate in ABBA order over the rounds. The weights evaluated come from a file the parent writes
once (ResNet-32 at its seeded initialisation with BatchNorm statistics from a pass over training data),
so every launch evaluates the same model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from benchmarks.common import PYTHON, REPO, abba_order, child_env, cifar_shaped_lt, free_port, median, spread, timer  # noqa: E402

TRAIN_MAX_PER_CLASS = 500  # 1,240 training images before rounding up to whole batches
BATCH = 128


def prepare_weights(path: Path, eval_per_class: int) -> None:
    """Seeded ResNet-32 with BatchNorm running statistics from a few training batches (no gradient)."""
    import torch

    from benchmarks import ours
    from hpc_train.train.data.pipeline import Feed
    from hpc_train.train.data.samplers import GlobalSampler
    from hpc_train.train.model.models import init_model

    data = cifar_shaped_lt(TRAIN_MAX_PER_CLASS, test_per_class=eval_per_class, multiple_of=BATCH)
    spec = ours.recipe_spec(device="cpu")
    model = init_model(spec.train, data).train()
    feed = Feed(data, torch.device("cpu"), rank=0, world_size=1, seed=0, crop_padding=4, flip=True,
                channels_last=False, num_workers=0)
    sampler = GlobalSampler(data.train.labels, data.num_classes, name="instance", seed=0)
    with torch.no_grad():
        for step, (x, _, _) in enumerate(feed.train_batches(sampler, 0, BATCH)):
            model(x)
            if step == 3:
                break
    torch.save(model.state_dict(), path)


def launch(world_size: int, weights: Path, *, steps: int, eval_per_class: int, log_dir: Path) -> dict[str, Any]:
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        env = child_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                        HPC_TRAIN_SITE=str(log_dir / "site.yaml"))
        err = open(log_dir / f"dist-ws{world_size}-rank{rank}.log", "w")
        procs.append((subprocess.Popen([PYTHON, "-m", "benchmarks.dist_bench", "--worker", "--weights", str(weights),
                                        "--steps", str(steps), "--eval-per-class", str(eval_per_class)],
                                       cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True), err))
    outs = []
    for proc, err in procs:
        out, _ = proc.communicate(timeout=600)
        err.close()
        if proc.returncode != 0:
            raise RuntimeError(f"dist benchmark rank exited with {proc.returncode}; see {err.name}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs[0]


def run(*, rounds: int, steps: int, eval_per_class: int, log_dir: Path) -> dict[str, Any]:
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "site.yaml").write_text("{}\n")
    weights = log_dir / "eval-weights.pt"
    prepare_weights(weights, eval_per_class)
    got: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for order in abba_order([1, 2], rounds):
        for ws in order:
            got[ws].append(launch(ws, weights, steps=steps, eval_per_class=eval_per_class, log_dir=log_dir))
    tables = {ws: [(r["correct"], r["count"]) for r in runs] for ws, runs in got.items()}
    identical = all(t == tables[1][0] for ws in tables for t in tables[ws])
    first = got[2][0]
    out: dict[str, Any] = {
        "rounds": rounds, "timed_steps": steps, "batch_global": BATCH, "train_images": first["train_images"],
        "eval_images": sum(first["count"]), "eval_batch_size": first["eval_batch_size"],
        "threads_per_rank": {str(ws): got[ws][0]["torch_threads"] for ws in got},
        "step_ws1_s": spread([r["step_s"] for r in got[1]]), "step_ws2_s": spread([r["step_s"] for r in got[2]]),
        "eval_ws1_wall_s": spread([r["eval_wall_s"] for r in got[1]]),
        "eval_ws2_wall_s": spread([r["eval_wall_s"] for r in got[2]]),
        "eval_identical_per_class": identical,
        "per_class_accuracy": [c / n if n else None for c, n in zip(*tables[1][0])],
        "gloo_all_reduce_grad_ms": spread([r["all_reduce_grad_ms"] for r in got[2]]),
        "gradient_bytes": first["gradient_bytes"], "ddp": first["ddp"],
    }
    out["ddp_step_ratio"] = out["step_ws2_s"]["median"] / out["step_ws1_s"]["median"]
    out["eval_ws2_vs_ws1"] = out["eval_ws2_wall_s"]["median"] / out["eval_ws1_wall_s"]["median"]
    return out


# --------------------------------------------------------------------------------------------------
# One rank
# --------------------------------------------------------------------------------------------------


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from benchmarks import ours
    from hpc_train.rank.dist import DistEnv, init_process_group

    env = DistEnv.from_environ()
    ws = env.world_size
    if ws > 1:
        init_process_group(env, backend="gloo", timeout_s=300)
    data = cifar_shaped_lt(TRAIN_MAX_PER_CLASS, test_per_class=args.eval_per_class, multiple_of=BATCH)
    spec = ours.recipe_spec(device="cpu", world_size=ws, eval_batch_size=500)  # as BENCHMARKS.md measured it
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-dist-r{env.rank}-"))
    trainer = ours.build_trainer(spec, data, run_dir, rank=env.rank, world_size=ws)

    def sync() -> None:
        if ws > 1:
            dist.barrier()

    # Warm-up: the epoch's last step only (first DDP iteration rebuilds its buckets; kernels; allocator).
    trainer.step_in_epoch = trainer.steps_per_epoch - 1
    ours.train_one_epoch(trainer)
    sync()
    trainer.step_in_epoch = trainer.steps_per_epoch - args.steps
    elapsed = timer()
    ours.train_one_epoch(trainer)
    sync()
    step_s = elapsed() / args.steps

    grads = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    reduce_ms = []
    if ws > 1:
        for _ in range(10):
            t = timer()
            dist.all_reduce(grads)
            reduce_ms.append(1000 * t())
    ddp_info: dict[str, Any] = {}
    if ws > 1:
        from torch.distributed import _DEFAULT_FIRST_BUCKET_BYTES

        ddp = trainer.train_model
        logging_data = ddp._get_ddp_logging_data()
        ddp_info = {"bucket_cap_mb": ddp.bucket_bytes_cap / 2**20,
                    "first_bucket_mb": _DEFAULT_FIRST_BUCKET_BYTES / 2**20,
                    "gradient_as_bucket_view": ddp.gradient_as_bucket_view, "static_graph": ddp.static_graph,
                    "bucket_sizes_bytes": logging_data.get("bucket_sizes"),
                    "backend": dist.get_backend()}

    trainer.model.load_state_dict(torch.load(args.weights, weights_only=True))
    sync()
    elapsed = timer()
    result = trainer.evaluate("test", trainer.heads())["plain"]
    eval_wall_s = elapsed()
    if ws > 1:
        dist.barrier()  # leave together: gloo torn down under a busy peer can abort at exit
        dist.destroy_process_group()
    return {"rank": env.rank, "world_size": ws, "torch_threads": torch.get_num_threads(), "step_s": step_s,
            "train_images": len(data.train), "eval_batch_size": spec.train.eval_batch_size,
            "eval_wall_s": eval_wall_s, "correct": result[0], "count": result[1],
            "all_reduce_grad_ms": median(reduce_ms) if reduce_ms else 0.0, "gradient_bytes": grads.numel() * 4,
            "ddp": ddp_info}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--eval-per-class", type=int, default=100)
    args = parser.parse_args(argv)
    print(json.dumps(_worker(args)), flush=True)
    sys.stderr.flush()
    # The answer is out: skip interpreter teardown, where torch's process-group threads have been seen
    # to abort ("terminate called without an active exception") after a clean destroy_process_group.
    os._exit(0)


if __name__ == "__main__":
    main()
