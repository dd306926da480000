"""GPU checks — run on a machine with an NVIDIA GPU (not collected by pytest); ≤ 150 s on one H200.

    PYTHONPATH=. python3 tests/unit/train/gpu_check.py [--out report.json] [--keep DIR]
    PYTHONPATH=. python3 tests/unit/train/gpu_check.py --cpu-smoke      # the script itself, on a CPU

Runs the real entrypoint (``python -m hpc_train.train``, no Slurm) and a few in-process probes, four at a
time, and prints one line per check as it finishes — ``PASS|FAIL|SKIP name seconds {details}`` — then one
JSON report; exit 0 only when every check that ran passed. Checks:

  nccl            a raw NCCL process group (world min(2, GPUs)): all_reduce, broadcast_object_list, barrier
  captured_run    LDAM-DRW on synthetic-lt, bf16 + channels_last, device auto with a GPU requested: both
                  batch shapes captured, no fallback, the end line, the rank file says cuda:0
  graphs_match    the same deterministic fp32 run with cuda_graphs on and off: the same weights
  sync_free       in one process, after the captures: a whole epoch of replays and a background checkpoint
                  under torch.cuda.set_sync_debug_mode("error"); one evaluation makes exactly one
                  synchronising call; the checkpoint's host stall <= 50 ms
  compile_cache   compile + capture, two short runs on one fresh compile cache: no graph beyond the
                  shapes used (a recompile fails the check), the second run compiles faster
  fp16            fp16 + GradScaler (eager: the log line says why graphs are off), scale in the checkpoint
  resume          USR2 mid-epoch on the captured path -> exit 75 -> restart -> the uninterrupted step count
  dp              strategy dp (DataParallel over the visible GPUs)
  ddp2_captured   2 GPUs only: 2 NCCL ranks with cuda_graphs on (the captured all-reduce) against eager DDP
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
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[3]
PYTHON = sys.executable
DEADLINE_S = 140.0

BASE = {
    "epochs": 5, "batch_size": 128, "eval_batch_size": 10_000, "log_every_steps": 5, "keep_checkpoints": 10,
    "data": {"name": "synthetic-lt", "num_classes": 10, "max_per_class": 300, "imbalance_factor": 10,
             "test_per_class": 50, "image_size": 32},  # 1,222 training images: 9 full batches and one of 70
    "model": {"name": "resnet32", "classifier": "cosine"}, "loss": {"name": "ldam", "drw_epoch": 3},
    "optim": {"lr": 0.1, "weight_decay": 2e-4},
    "schedule": {"name": "multistep", "warmup_epochs": 1, "milestones": [2, 4], "gamma": 0.1},
}
CPU_SMOKE = {"model": {"name": "small_cnn"}, "data": {"image_size": 8, "max_per_class": 60, "test_per_class": 10},
             "batch_size": 32, "amp": "off", "channels_last": False}
"""--cpu-smoke: the same runs, small enough for a CPU (bf16 convolutions are slow on most CPUs)."""


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
    """Job files, rank processes and their logs in one work directory; kills what is left at the end."""

    def __init__(self, work: Path, device: str) -> None:
        self.work, self.device, self.procs = work, device, []
        self.lock = threading.Lock()
        (work / "site.yaml").write_text("{}\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))
                    and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        self.env.update({"HPC_TRAIN_SITE": str(work / "site.yaml"), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2",
                         "PYTHONPATH": str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")})

    def job(self, name: str, train: dict, *, world: int = 1, gpus: int | None = None) -> Path:
        import yaml

        gpus = (world if self.device == "cuda" else 0) if gpus is None else gpus
        train = _merge(BASE, {"device": "auto" if self.device == "cuda" else "cpu", **train})
        if self.device == "cpu":
            train = _merge(train, CPU_SMOKE)
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "runs_dir": str(self.work / "runs"),
                                        "slurm": {"nodes": 1, "gpus_per_node": gpus, "tasks_per_node": world},
                                        "train": train}, sort_keys=False))
        return path

    def start(self, args: list[str], world: int, log: str, *, module: str = "hpc_train.train") -> list:
        port, procs = str(_free_port()), []
        for rank in range(world):
            env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            out = open(self.work / f"{log}-{rank}.log", "w")
            procs.append(subprocess.Popen([PYTHON, "-m", module, *args] if module else [PYTHON, *args], cwd=REPO,
                                          env=env, stdout=out, stderr=subprocess.STDOUT))
        with self.lock:
            self.procs += procs
        return procs

    def log(self, name: str, rank: int = 0) -> str:
        path = self.work / f"{name}-{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def run(self, name: str, train: dict, *, world: int = 1, gpus: int | None = None, timeout_s: float = 120) -> dict:
        job = self.job(name, train, world=world, gpus=gpus)
        run_dir = self.work / "runs" / name
        start = time.monotonic()
        codes = [_wait(p, timeout_s) for p in self.start([str(job), "--run-dir", str(run_dir)], world, name)]
        summary_file = run_dir / "summary.json"
        return {"codes": codes, "wall_s": round(time.monotonic() - start, 1), "run_dir": run_dir, "log": self.log(name),
                "summary": json.loads(summary_file.read_text()) if summary_file.exists() else {}}

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def _newest(run_dir: Path) -> dict | None:
    from hpc_train.train.state import checkpoint as ckpt

    found = ckpt.load_latest(run_dir)
    return found[0] if found else None


def _weights_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp_min(1e-12))
               for k in b if b[k].is_floating_point())


def _ok_run(r: dict) -> dict:
    out = {"exit": r["codes"], "wall_s": r["wall_s"]}
    if any(c != 0 for c in r["codes"]):
        out["log_tail"] = r["log"][-1200:]
    return out


# --------------------------------------------------------------------------------------------------
# The checks: each returns (passed, details)
# --------------------------------------------------------------------------------------------------


def check_nccl(runner: Runner, world: int) -> tuple[bool, dict]:
    code = ("import torch, torch.distributed as dist\n"
            "from hpc_train.dist import DistEnv, init_process_group\n"
            "env = DistEnv.from_environ(); idx = env.cuda_device_index(torch.cuda.device_count())\n"
            "torch.cuda.set_device(idx); init_process_group(env, backend='nccl', timeout_s=60)\n"
            "t = torch.ones(4, device='cuda') * (env.rank + 1); dist.all_reduce(t)\n"
            "box = ['from0' if env.rank == 0 else None]; dist.broadcast_object_list(box, src=0)\n"
            "dist.barrier(device_ids=[idx])\n"
            "assert t.tolist() == [sum(range(1, env.world_size + 1))] * 4 and box == ['from0'], (t, box)\n"
            "dist.destroy_process_group(); print('NCCL_OK', torch.cuda.nccl.version())\n")
    procs = runner.start(["-c", code], world, "nccl", module="")
    codes = [_wait(p, 60) for p in procs]
    ok = codes == [0] * world and "NCCL_OK" in runner.log("nccl")
    return ok, {"world": world, "exit": codes, **({} if ok else {"log_tail": runner.log("nccl")[-1200:]})}


def check_captured_run(runner: Runner) -> tuple[bool, dict]:
    r = runner.run("captured_run", {"amp": "bf16", "channels_last": True})
    graphs = r["summary"].get("timing", {}).get("cuda_graphs", {})
    rank0 = r["run_dir"] / "ranks" / "rank-0.json"
    device = json.loads(rank0.read_text())["device"] if rank0.exists() else None
    end = re.search(r"^5 epochs in .*$", r["log"], re.M)
    ok = (r["codes"] == [0] and graphs.get("captured") == ["full", "last"] and not graphs.get("fell_back")
          and device == "cuda:0" and end is not None)
    return ok, {**_ok_run(r), "graphs": graphs, "device": device, "end_line": end.group(0) if end else None}


def check_graphs_match(runner: Runner) -> tuple[bool, dict]:
    common = {"deterministic": True, "tf32": False, "epochs": 5}
    jobs = {mode: runner.job(f"match_{mode}", {**common, "cuda_graphs": mode == "on"}) for mode in ("on", "off")}
    procs = {mode: runner.start([str(job), "--run-dir", str(runner.work / "runs" / f"match_{mode}")], 1,
                                f"match_{mode}") for mode, job in jobs.items()}
    codes = {mode: [_wait(p, 120) for p in ps] for mode, ps in procs.items()}
    states = {mode: _newest(runner.work / "runs" / f"match_{mode}") for mode in procs}
    if any(c != [0] for c in codes.values()) or not all(states.values()):
        return False, {"exit": codes, "log_tail": runner.log("match_on")[-1200:]}
    diff = _weights_diff(states["on"]["model"], states["off"]["model"])
    steps = [states[m]["global_step"] for m in ("on", "off")]
    return steps[0] == steps[1] and diff <= 1e-5, {"max_rel_weight_diff": diff, "bitwise": diff == 0.0, "steps": steps}


def check_sync_free(runner: Runner) -> tuple[bool, dict]:
    out = runner.work / "sync_free.json"
    procs = runner.start([str(Path(__file__)), "--inner", "sync_free", "--inner-out", str(out),
                          "--device", runner.device], 1, "sync_free", module="")
    code = _wait(procs[0], 120)
    if code != 0 or not out.exists():
        return False, {"exit": code, "log_tail": runner.log("sync_free")[-1500:]}
    result = json.loads(out.read_text())
    return bool(result.pop("ok")), result


def check_compile_cache(runner: Runner) -> tuple[bool, dict]:
    cache = runner.work / "compile-cache"
    train = {"compile": True, "compile_cache_dir": str(cache), "amp": "bf16", "channels_last": True, "epochs": 5,
             "model": {"name": "small_cnn", "classifier": "cosine"}}
    cold = runner.run("compile_cold", train, timeout_s=120)
    warm = runner.run("compile_warm", train, timeout_s=60)
    details, ok = {}, True
    for name, r in (("cold", cold), ("warm", warm)):
        timing = r["summary"].get("timing", {})
        details[name] = {**_ok_run(r), "compiled_graphs": timing.get("compiled_graphs"),
                         "captured": timing.get("cuda_graphs", {}).get("captured"),
                         "first_epoch_note": "train_s includes compile", "train_s": timing.get("train_s")}
        # Two shapes (the full batch and the short last one) compile two graphs; more is a recompile.
        ok &= r["codes"] == [0] and timing.get("compiled_graphs") == 2 and \
            timing.get("cuda_graphs", {}).get("captured") == ["full", "last"]
    ok &= bool(warm["wall_s"] < cold["wall_s"])
    details["cache_files"] = sum(1 for _ in cache.rglob("*")) if cache.exists() else 0
    return ok, details


def check_fp16(runner: Runner) -> tuple[bool, dict]:
    r = runner.run("fp16", {"amp": "fp16", "channels_last": True, "epochs": 2, "loss": {"drw_epoch": 1},
                            "schedule": {"milestones": [1]}})
    state = _newest(r["run_dir"]) or {}
    scale = (state.get("scaler") or {}).get("scale", 0)
    said = "off because amp fp16" in r["log"]
    return r["codes"] == [0] and scale > 0 and said, {**_ok_run(r), "grad_scale": scale, "graphs_off_line": said}


def check_resume(runner: Runner) -> tuple[bool, dict]:
    train = {"deterministic": True, "preempt_check_every_steps": 1, "log_every_steps": 1, "amp": "bf16",
             "channels_last": True}
    job = runner.job("resume", train)
    straight_dir = runner.work / "runs" / "resume_straight"
    straight = runner.start([str(job), "--run-dir", str(straight_dir)], 1, "resume_straight")
    run_dir = runner.work / "runs" / "resume"
    first = runner.start([str(job), "--run-dir", str(run_dir)], 1, "resume_first")
    deadline = time.monotonic() + 90
    while not re.search(r"epoch 4/5 step 1/", runner.log("resume_first")):  # full batch captured, last next
        if time.monotonic() > deadline or first[0].poll() is not None:
            return False, {"detail": "never reached epoch 4", "log_tail": runner.log("resume_first")[-1200:]}
        time.sleep(0.005)
    os.kill(first[0].pid, signal.SIGUSR2)
    first_code = _wait(first[0], 60)
    stopped = _newest(run_dir) or {}
    second_code = _wait(runner.start([str(job), "--run-dir", str(run_dir)], 1, "resume_second")[0], 90)
    straight_code = _wait(straight[0], 90)
    resumed, reference = _newest(run_dir), _newest(runner.work / "runs" / "resume_straight")
    out = {"exit": [first_code, second_code, straight_code],
           "stopped_at": [stopped.get("epoch"), stopped.get("step_in_epoch")]}
    if resumed is None or reference is None:
        return False, {**out, "log_tail": runner.log("resume_second")[-1200:]}
    out.update(steps=[resumed["global_step"], reference["global_step"]],
               max_rel_weight_diff=_weights_diff(resumed["model"], reference["model"]))
    # The host may have queued the rest of the epoch before the signal's step was printed: the stop lands
    # anywhere after it, at a step or at the epoch's end.
    ok = (out["exit"] == [75, 0, 0] and 0 < (stopped.get("global_step") or 0) < reference["global_step"]
          and resumed["global_step"] == reference["global_step"])
    return ok, out


def check_dp(runner: Runner) -> tuple[bool, dict]:
    r = runner.run("dp", {"strategy": "dp", "amp": "bf16", "epochs": 2, "loss": {"drw_epoch": 1},
                          "schedule": {"milestones": [1]}}, gpus=1 if runner.device == "cuda" else 0)
    return r["codes"] == [0], _ok_run(r)


def check_ddp2_captured(runner: Runner) -> tuple[bool, dict]:
    common = {"deterministic": True, "tf32": False, "epochs": 5, "sync_bn": True}
    runs = {mode: runner.run(f"ddp2_{mode}", {**common, "cuda_graphs": mode == "on"}, world=2)
            for mode in ("on", "off")}
    states = {mode: _newest(r["run_dir"]) for mode, r in runs.items()}
    if any(r["codes"] != [0, 0] for r in runs.values()) or not all(states.values()):
        return False, {mode: _ok_run(r) for mode, r in runs.items()}
    graphs = runs["on"]["summary"].get("timing", {}).get("cuda_graphs", {})
    diff = _weights_diff(states["on"]["model"], states["off"]["model"])
    return graphs.get("captured") == ["full", "last"] and diff <= 1e-4, {"max_rel_weight_diff": diff, "graphs": graphs}


# --------------------------------------------------------------------------------------------------
# The in-process probe (a process of its own)
# --------------------------------------------------------------------------------------------------


def inner_sync_free(device_name: str, out: Path) -> None:
    """After both captures: an epoch of replays and a periodic checkpoint under sync debug "error" (on the
    CPU: the dispatcher guard around every step instead), one evaluation with exactly one sync."""
    import warnings

    import torch

    from hpc_train.config import JobSpec, build, validate
    from hpc_train.rank.dist import DistEnv
    from hpc_train.train.data import datasets
    from hpc_train.train.loop.context import RankContext
    from hpc_train.train.loop.engine import Trainer
    from hpc_train.train.loop.guard import NoHostSync

    cuda = device_name == "cuda"
    train = _merge(BASE, {"device": device_name, "amp": "bf16", "channels_last": True, "epochs": 8,
                          "checkpoint_every_epochs": 1000})
    spec = validate(build(JobSpec, {"slurm": {"gpus_per_node": int(cuda)},
                                    "train": train if cuda else _merge(train, CPU_SMOKE)}))
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ctx = RankContext(env=DistEnv.from_environ(), device=device, rank=0, world_size=1, distributed=False)
    trainer = Trainer(spec, ctx, datasets.load(spec.train.data), Path(tempfile.mkdtemp(prefix="gpu-check-sync-")))
    trainer.clock.begin()
    for _ in range(5):  # the last batch's 4th occurrence is captured in epoch 4
        trainer.train_epoch()
    result: dict[str, Any] = {"captured": sorted(trainer.runner.graphs) if trainer.runner else []}
    trainer.save_checkpoint(wait=True)  # the pinned buffers exist from here on
    replays = sum(trainer.runner.replays.values()) if trainer.runner else 0
    try:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        else:
            trainer.step.guard = NoHostSync
        trainer.train_epoch()
        started = time.perf_counter()
        trainer.save_checkpoint(wait=False)
        result["checkpoint_stall_ms"] = round(1000 * (time.perf_counter() - started), 2)
        result["epoch_without_sync"] = True
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        result["epoch_without_sync"] = False
        result["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    result["replays_in_epoch"] = (sum(trainer.runner.replays.values()) - replays) if trainer.runner else 0
    trainer.checkpointer.wait()
    trainer.evaluate("test", trainer.heads())  # the first one uploads and normalises the split (pageable copies)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.evaluate("test", trainer.heads())
    if cuda:
        torch.cuda.set_sync_debug_mode("default")
    result["evaluation_syncs"] = sum("synchroniz" in str(w.message) for w in caught) if cuda else None
    # The 50 ms bound is the GPU's (pinned copies queued behind the steps); a CPU clones the state.
    result["ok"] = (result["epoch_without_sync"] and (not cuda or (
        result.get("checkpoint_stall_ms", 1e9) <= 50 and result["captured"] == ["full", "last"]
        and result["evaluation_syncs"] == 1 and result["replays_in_epoch"] == trainer.steps_per_epoch)))
    out.write_text(json.dumps(result))


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("--keep", help="keep the run directories and logs in this directory")
    parser.add_argument("--cpu-smoke", action="store_true", help="run the checks that make sense on a CPU")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--inner-out", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.inner == "sync_free":
        inner_sync_free(args.device, Path(args.inner_out))
        return 0
    import torch

    began = time.monotonic()
    device = "cpu" if args.cpu_smoke else "cuda"
    report: dict[str, Any] = {"torch": torch.__version__, "device": device, "checks": {}}
    if device == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({**report, "ok": False, "note": "no CUDA: nothing to check (--cpu-smoke on a CPU)"}))
            return 1
        report.update(gpus=torch.cuda.device_count(), gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    gpus = report.get("gpus", 0)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hpc-train-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(work, device)
    gpu_only = "needs a GPU (--cpu-smoke)"
    checks: dict[str, Callable[[], tuple[bool, dict]] | str] = {
        "compile_cache": (lambda: check_compile_cache(runner)) if device == "cuda" else gpu_only,
        "resume": lambda: check_resume(runner),
        "captured_run": (lambda: check_captured_run(runner)) if device == "cuda" else gpu_only,
        "sync_free": lambda: check_sync_free(runner),
        "graphs_match": (lambda: check_graphs_match(runner)) if device == "cuda" else gpu_only,
        "nccl": (lambda: check_nccl(runner, min(2, gpus))) if device == "cuda" else gpu_only,
        "fp16": (lambda: check_fp16(runner)) if device == "cuda" else gpu_only,
        "dp": lambda: check_dp(runner),
        "ddp2_captured": (lambda: check_ddp2_captured(runner)) if gpus >= 2 else "needs 2 GPUs",
    }

    def line(status: str, name: str, seconds: float, details: dict) -> None:
        report["checks"][name] = {"status": status, "seconds": round(seconds, 1), **details}
        print(f"{status} {name} {seconds:.1f} s {json.dumps(details, default=str)}", flush=True)

    for name, check in checks.items():
        if isinstance(check, str):
            line("SKIP", name, 0.0, {"why": check})
    with ThreadPoolExecutor(max_workers=4 if device == "cuda" else 2) as pool:
        started = {pool.submit(check): (name, time.monotonic()) for name, check in checks.items() if callable(check)}
        pending = set(started)
        while pending:
            done, pending = wait(pending, timeout=max(0.0, DEADLINE_S - (time.monotonic() - began)),
                                 return_when=FIRST_COMPLETED)
            if not done:
                runner.kill_all()
                for future in pending:
                    name, t0 = started[future]
                    line("FAIL", name, time.monotonic() - t0, {"why": f"not done within {DEADLINE_S:.0f} s"})
                break
            for future in done:
                name, t0 = started[future]
                try:
                    ok, details = future.result()
                except Exception as exc:  # noqa: BLE001 - a check that crashed failed
                    ok, details = False, {"error": f"{type(exc).__name__}: {exc}"}
                line("PASS" if ok else "FAIL", name, time.monotonic() - t0, details)
        pool.shutdown(wait=False, cancel_futures=True)
    runner.kill_all()
    report["total_s"] = round(time.monotonic() - began, 1)
    report["ok"] = all(c["status"] != "FAIL" for c in report["checks"].values())
    print(json.dumps({"ok": report["ok"], "total_s": report["total_s"], "device": device,
                      **{k: report.get(k) for k in ("gpu", "gpus", "cuda", "torch")}}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
