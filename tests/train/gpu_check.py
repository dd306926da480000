"""GPU check of the training entrypoint — a standalone script, not collected by pytest.

Run it on a machine with one or more NVIDIA GPUs, torch installed and this repository importable:

    PYTHONPATH=. python tests/train/gpu_check.py [--out report.json] [--keep DIR]

It starts real rank processes of ``python -m hpc_train.train`` (torchrun-style environment, no Slurm,
no submitit) on ``synthetic-lt`` and checks, each as one short run:

  ddp_bf16       2 ranks, NCCL, DDP, bf16 autocast, channels_last, SyncBatchNorm, cuda:0 / cuda:1
                 (with one visible GPU: 1 rank, and NCCL is exercised by ``nccl_smoke`` alone — NCCL
                 refuses two ranks on one device)
  nccl_smoke     a raw NCCL process group: all_reduce, broadcast_object_list, barrier(device_ids)
  fp16           1 rank, fp16 autocast + GradScaler (the V100/T4 path), scaler state in the checkpoint
  compile        1 rank, torch.compile + bf16
  dp             strategy dp (legacy DataParallel over the visible GPUs)
  resume         USR2 mid-epoch on the last rank → exit 75 → restart → same step count as an
                 uninterrupted run; the weight difference is reported (deterministic kernels on)
  no_silent_cpu  device auto with GPUs requested picks CUDA (rank file says cuda:N)

Prints one compact JSON report (and writes it with --out); exit code 0 when every check passed.
Budget: about 2-3 minutes on one GPU (compile dominates).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

BASE_TRAIN = {
    "device": "cuda", "epochs": 2, "batch_size": 128, "eval_batch_size": 512, "log_every_steps": 5,
    "data": {"name": "synthetic-lt", "num_classes": 10, "max_per_class": 600, "imbalance_factor": 10,
             "test_per_class": 50, "image_size": 32},
    "model": {"name": "resnet32"}, "loss": {"name": "balanced_softmax"},
    "optim": {"lr": 0.1, "weight_decay": 2e-4}, "schedule": {"name": "cosine"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for k, v in changes.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Runner:
    def __init__(self, work: Path) -> None:
        self.work = work
        site = work / "site.yaml"
        site.write_text("{}\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            self.env.pop(k, None)
        self.env.update({"HPC_TRAIN_SITE": str(site), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "4",
                         "PYTHONPATH": str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")})

    def job(self, name: str, train: dict, *, world: int, gpus_per_node: int) -> Path:
        import yaml

        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "name": name, "runs_dir": str(self.work / "runs"),
            "slurm": {"nodes": 1, "gpus_per_node": gpus_per_node, "tasks_per_node": world},
            "train": _merge(BASE_TRAIN, train)}, sort_keys=False))
        return path

    def start(self, name: str, job: Path, run_dir: Path, world: int, tag: str) -> list[subprocess.Popen]:
        port = str(_free_port())
        procs = []
        for rank in range(world):
            env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            log = open(self.work / f"{name}-{tag}-{rank}.log", "w")
            procs.append(subprocess.Popen([PYTHON, "-m", "hpc_train.train", str(job), "--run-dir", str(run_dir)],
                                          cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        return procs

    def log(self, name: str, tag: str, rank: int = 0) -> str:
        path = self.work / f"{name}-{tag}-{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def run(self, name: str, train: dict, *, world: int = 1, gpus_per_node: int | None = None,
            timeout_s: float = 300) -> dict:
        job = self.job(name, train, world=world, gpus_per_node=world if gpus_per_node is None else gpus_per_node)
        run_dir = self.work / "runs" / name
        start = time.monotonic()
        procs = self.start(name, job, run_dir, world, "run")
        codes = [_wait(p, timeout_s) for p in procs]
        return {"codes": codes, "wall_s": round(time.monotonic() - start, 1), "run_dir": run_dir,
                "log": self.log(name, "run")}


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def _newest(run_dir: Path) -> dict | None:
    from hpc_train.train import checkpoint as ckpt

    found = ckpt.load_latest(run_dir)
    return found[0] if found else None


def _summary(result: dict, extra: dict | None = None) -> dict:
    run_dir: Path = result["run_dir"]
    out = {"ok": all(c == 0 for c in result["codes"]), "exit": result["codes"], "wall_s": result["wall_s"]}
    summary_file = run_dir / "summary.json"
    if summary_file.exists():
        s = json.loads(summary_file.read_text())
        out["top1"] = round(s["last"]["top1"], 4) if s.get("last") else None
        out["steps"] = s["global_step"]
    speeds = [float(m) for m in re.findall(r"img/s (\d+)", result["log"])]
    if speeds:
        out["img_per_s_last"] = speeds[-1]
    if not out["ok"]:
        out["log_tail"] = result["log"][-1500:]
    out.update(extra or {})
    return out


def check_nccl_smoke(runner: Runner, world: int) -> dict:
    code = (
        "import os, torch, torch.distributed as dist, datetime\n"
        "from hpc_train.dist import DistEnv, init_process_group\n"
        "env = DistEnv.from_environ()\n"
        "idx = env.cuda_device_index(torch.cuda.device_count()); torch.cuda.set_device(idx)\n"
        "init_process_group(env, backend='nccl', timeout_s=120)\n"
        "t = torch.ones(4, device='cuda') * (env.rank + 1)\n"
        "dist.all_reduce(t)\n"
        "box = ['from0' if env.rank == 0 else None]; dist.broadcast_object_list(box, src=0)\n"
        "dist.barrier(device_ids=[idx])\n"
        "assert t.tolist() == [sum(range(1, env.world_size + 1))] * 4 and box == ['from0'], (t, box)\n"
        "dist.destroy_process_group(); print('NCCL_OK', env.rank, torch.cuda.nccl.version())\n"
    )
    port = str(_free_port())
    start = time.monotonic()
    procs = [subprocess.Popen([PYTHON, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(runner.env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(world)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    ok = all(p.returncode == 0 and "NCCL_OK" in o for p, o in zip(procs, outs))
    return {"ok": ok, "world": world, "wall_s": round(time.monotonic() - start, 1),
            **({} if ok else {"log_tail": outs[0][-1500:]})}


def check_resume(runner: Runner, world: int) -> dict:
    """USR2 mid-epoch on the last rank → 75 → restart → compare with an uninterrupted run."""
    train = {"epochs": 3, "batch_size": 32, "deterministic": True, "log_every_steps": 1,
             "preempt_check_every_steps": 1, "keep_checkpoints": 10, "amp": "bf16", "channels_last": True}
    straight = runner.run("resume_straight", train, world=world)
    name = "resume_preempted"
    job = runner.job(name, train, world=world, gpus_per_node=world)
    run_dir = runner.work / "runs" / name
    start = time.monotonic()
    procs = runner.start(name, job, run_dir, world, "first")
    deadline = time.monotonic() + 240
    while not re.search(r"epoch 2/3 step 3/", runner.log(name, "first")):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            return {"ok": False, "detail": "never reached epoch 2", "log_tail": runner.log(name, "first")[-1500:]}
        time.sleep(0.005)
    os.kill(procs[-1].pid, signal.SIGUSR2)
    first_codes = [_wait(p, 240) for p in procs]
    stopped = _newest(run_dir) or {}
    procs = runner.start(name, job, run_dir, world, "second")
    second_codes = [_wait(p, 240) for p in procs]
    resumed, reference = _newest(run_dir), _newest(straight["run_dir"])
    out = {"first_exit": first_codes, "second_exit": second_codes, "straight_exit": straight["codes"],
           "stopped_at": [stopped.get("epoch"), stopped.get("step_in_epoch")],
           "wall_s": round(time.monotonic() - start + straight["wall_s"], 1)}
    if resumed is None or reference is None:
        return {"ok": False, **out, "log_tail": runner.log(name, "second")[-1500:]}
    diffs = [float((resumed["model"][k].float() - reference["model"][k].float()).abs().max())
             for k in reference["model"] if reference["model"][k].is_floating_point()]
    out.update(steps=[resumed["global_step"], reference["global_step"]], max_abs_weight_diff=max(diffs))
    out["ok"] = (first_codes == [75] * world and second_codes == [0] * world and straight["codes"] == [0] * world
                 and stopped.get("epoch") == 1 and 0 < (stopped.get("step_in_epoch") or 0)
                 and resumed["global_step"] == reference["global_step"])
    out["bitwise_equal"] = max(diffs) == 0.0
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("--keep", help="keep the run directories and logs in this directory")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    report: dict = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "checks": {}, "notes": []}
    if not torch.cuda.is_available():
        report["notes"].append("no CUDA: nothing to check")
        print(json.dumps(report))
        return 1
    gpus = torch.cuda.device_count()
    report.update(gpus=gpus, gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                  bf16=torch.cuda.is_bf16_supported())
    world = min(2, gpus)
    if world == 1:
        report["notes"].append("one visible GPU: the DDP run uses 1 rank (NCCL refuses 2 ranks on one device); "
                               "NCCL itself is checked by nccl_smoke at world size 1")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hpc-train-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(work)
    checks = report["checks"]
    t0 = time.monotonic()

    checks["nccl_smoke"] = check_nccl_smoke(runner, world)

    r = runner.run("ddp_bf16", {"amp": "bf16", "channels_last": True, "sync_bn": world > 1}, world=world)
    ranks = [json.loads(p.read_text()) for p in sorted((r["run_dir"] / "ranks").glob("rank-*.json"))]
    devices = [x["device"] for x in ranks]
    checks["ddp_bf16"] = _summary(r, {"world": world, "devices": devices,
                                      "amp_logged": "amp bf16, channels_last True" in r["log"]})
    checks["ddp_bf16"]["ok"] &= devices == [f"cuda:{i}" for i in range(world)] and checks["ddp_bf16"]["amp_logged"]

    r = runner.run("fp16", {"amp": "fp16", "channels_last": True}, world=1)
    state = _newest(r["run_dir"])
    scale = (state or {}).get("scaler") or {}
    checks["fp16"] = _summary(r, {"grad_scale": scale.get("scale")})
    checks["fp16"]["ok"] &= bool(scale) and scale.get("scale", 0) > 0

    r = runner.run("compile", {"compile": True, "amp": "bf16", "model": {"name": "small_cnn"}, "epochs": 2}, world=1,
                   timeout_s=400)
    checks["compile"] = _summary(r)

    # One process; DataParallel scatters over every visible GPU (the config asks for one: the Slurm
    # side's validation ties GPUs per node to ranks per node).
    r = runner.run("dp", {"strategy": "dp", "amp": "bf16", "epochs": 1}, world=1, gpus_per_node=1)
    checks["dp"] = _summary(r, {"gpus_visible": gpus})

    r = runner.run("no_silent_cpu", {"device": "auto", "epochs": 1}, world=1)
    rank0 = json.loads((r["run_dir"] / "ranks" / "rank-0.json").read_text()) if r["codes"] == [0] else {}
    checks["no_silent_cpu"] = _summary(r, {"device": rank0.get("device")})
    checks["no_silent_cpu"]["ok"] &= str(rank0.get("device", "")).startswith("cuda")

    checks["resume"] = check_resume(runner, world)

    report["total_s"] = round(time.monotonic() - t0, 1)
    report["ok"] = all(c.get("ok") for c in checks.values())
    text = json.dumps(report, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
