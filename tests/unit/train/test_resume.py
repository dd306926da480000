"""Preemption and resume with real processes and real signals (CPU, gloo, deterministic kernels).

Two 2-rank runs of the same job start together. One runs through. The other gets a real SIGUSR2, on
rank 1 only, in the middle of its second epoch: the ranks agree at the next step boundary, write a
checkpoint and exit 75 (not under Slurm, so not requeued). Started again on the same run directory it
resumes mid-epoch and must end with exactly the weights of the uninterrupted run, after exactly the
number of optimizer steps computed here from the data size, the batch and the epochs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpc_train.runs import rundir

torch = pytest.importorskip("torch")

from hpc_train.train.state import checkpoint as ckpt  # noqa: E402

from .helpers import (PYTHON, REPO, clean_env, digits_lt_counts, launch_ranks, steps_per_epoch,  # noqa: E402
                      wait_all, write_job)

WORLD = 2
BATCH = 8        # 4 per rank: many short steps, so "mid-epoch" is a wide target
EPOCHS = 3
TRAIN = {
    "epochs": EPOCHS, "batch_size": BATCH, "deterministic": True, "log_every_steps": 1,
    "preempt_check_every_steps": 1, "keep_checkpoints": 10, "eval_batch_size": 64,
    "data": {"name": "digits-lt", "imbalance_factor": 20},
    "model": {"name": "small_cnn"}, "loss": {"name": "balanced_softmax"},
    # AdamW keeps its own per-parameter step counter: a second, independent count of optimizer steps.
    "optim": {"name": "adamw", "lr": 0.002, "weight_decay": 0.01}, "schedule": {"name": "cosine", "warmup_epochs": 1},
}


def _newest_state(run_dir: Path) -> dict:
    state, _ = ckpt.load_latest(run_dir)
    return state


def _wait_for_line(path: Path, pattern: str, procs, timeout_s: float = 180) -> None:
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and rx.search(path.read_text()):
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"a rank ended before {pattern!r} appeared in {path}:\n{path.read_text()[-2000:]}")
        time.sleep(0.002)
    raise AssertionError(f"{pattern!r} did not appear in {path}")


def test_usr2_mid_epoch_then_resume_gives_the_uninterrupted_weights(tmp_path):
    job = write_job(tmp_path / "job.yaml", TRAIN, tasks=WORLD)
    preempted_dir = tmp_path / "preempted"
    # The uninterrupted run goes through the real torchrun, without --run-dir: rank 0 picks
    # <runs_dir>/<name>/local-<time> and every rank must agree on it.
    with open(tmp_path / "straight.out", "w") as out:
        straight = [subprocess.Popen([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                      str(WORLD), "-m", "hpc_train.train", str(job)], cwd=REPO,
                                     env=clean_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)]
    first = launch_ranks([str(job), "--run-dir", str(preempted_dir)], WORLD, tmp_path,
                         log_prefix=str(tmp_path / "first"))
    spe = steps_per_epoch(sum(digits_lt_counts(20)), BATCH)
    assert spe == 53  # 417 images: 52 global batches of 8 and a last one of 1 image (rank 1 holds none of it)
    # Rank 0 logs every step; a few steps into the second epoch, signal rank 1 (only).
    _wait_for_line(tmp_path / "first-0.err", rf"epoch 2/{EPOCHS} step 3/{spe}", first)
    os.kill(first[1].pid, signal.SIGUSR2)
    assert wait_all(first) == [75, 75], (tmp_path / "first-0.err").read_text()[-3000:]
    assert "preemption signal (USR2)" in (tmp_path / "first-1.err").read_text()
    assert "hpc-train submit --resume" in (tmp_path / "first-0.err").read_text()
    stopped = _newest_state(preempted_dir)
    assert stopped["epoch"] == 1 and 3 <= stopped["step_in_epoch"] < spe, (stopped["epoch"], stopped["step_in_epoch"])
    assert stopped["global_step"] == spe + stopped["step_in_epoch"]
    assert rundir.read_state(preempted_dir).state == "preempted"

    second = launch_ranks([str(job), "--run-dir", str(preempted_dir)], WORLD, tmp_path,
                          log_prefix=str(tmp_path / "second"))
    assert wait_all(second) == [0, 0], (tmp_path / "second-0.err").read_text()[-3000:]
    assert wait_all(straight) == [0], (tmp_path / "straight.out").read_text()[-3000:]
    (straight_dir,) = (tmp_path / "runs" / "t").iterdir()
    assert straight_dir.name.startswith("local-")
    ranks = [json.loads((straight_dir / "ranks" / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    assert [(x["rank"], x["world_size"], x["source"]) for x in ranks] == [(r, WORLD, "torchrun") for r in range(WORLD)]
    assert f"step {stopped['step_in_epoch']} of the epoch" in (tmp_path / "second-0.err").read_text()

    expected_steps = EPOCHS * spe  # computed from data size, batch and epochs, not read from the run
    resumed, reference = _newest_state(preempted_dir), _newest_state(straight_dir)
    assert resumed["global_step"] == reference["global_step"] == expected_steps
    adam_steps = {int(s["step"]) for s in resumed["optimizer"]["state"].values()}
    assert adam_steps == {expected_steps}
    assert resumed["model"].keys() == reference["model"].keys()
    different = [k for k in reference["model"] if not torch.equal(resumed["model"][k], reference["model"][k])]
    assert not different, different

    # ... and training did something: the weights moved away from the seeded initial model.
    from hpc_train.train.data import datasets
    from hpc_train.train.model.models import init_model
    from tests.unit.train.helpers import make_spec

    spec = make_spec(TRAIN, tasks=WORLD)
    initial = init_model(spec.train, datasets.load(spec.train.data)).state_dict()
    moved = [k for k, v in initial.items() if v.is_floating_point() and not torch.equal(v, resumed["model"][k])]
    assert len(moved) > 0.9 * sum(v.is_floating_point() for v in initial.values())
    # Both runs wrote the same metrics, and the resumed one did not evaluate an epoch twice.
    lines = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if '"record": ' not in x]  # noqa: E731
    assert [r["epoch"] for r in lines(preempted_dir)] == [1, 2, 3]
    assert [r["per_class"] for r in lines(preempted_dir)] == [r["per_class"] for r in lines(straight_dir)]


def _sig_caught(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _torch_loaded(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "libtorch" in maps or "libc10" in maps


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_usr2_before_torch_is_imported_does_not_kill_the_rank(tmp_path):
    # Slurm may signal a task seconds after it starts. Send USR2 to a real entrypoint process as soon
    # as its handler is installed and while torch is provably not loaded yet (/proc/PID/maps).
    train = {**TRAIN, "epochs": 1, "preempt_check_every_steps": 2, "schedule": {"name": "constant"}}
    job = write_job(tmp_path / "job.yaml", train, tasks=1)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([PYTHON, "-m", "hpc_train.train", str(job), "--run-dir", str(run_dir)], cwd=REPO,
                            env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _sig_caught(proc.pid, signal.SIGUSR2):
        assert proc.poll() is None and time.monotonic() < deadline, "the handler was never installed"
        time.sleep(0.0005)
    assert not _torch_loaded(proc.pid), "torch was imported before the preemption handler: too late"
    os.kill(proc.pid, signal.SIGUSR2)
    assert not _torch_loaded(proc.pid)  # delivered while torch was still not loaded
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, err[-2000:]  # not -12 (killed by the signal): checkpointed and stopped
    state = _newest_state(run_dir)
    assert state["global_step"] == 2  # the first agreement point
    assert "preemption signal (USR2)" in err
