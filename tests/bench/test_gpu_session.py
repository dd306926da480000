"""benchmarks/gpu_session.sh, the one command a GPU session runs: it must work on its first try there.

Its stages' programs each have their own CPU test (tests/bench/test_gpu_bench.py, test_gpu_pack.py,
test_op_count.py); its ``--cpu-smoke`` run end to end is in BENCHMARKS.md. Here the script itself runs with a
stand-in for python3 that writes what each stage would (given figures) and exits as told: it shows the order,
the caps, the result lines, the deadline, ``--only`` and what the output folder holds — not that the stages work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from benchmarks.common import REPO

SCRIPT = REPO / "benchmarks" / "gpu_session.sh"

STAND_IN = r"""#!/usr/bin/env bash
# python3 for the session's stages: records its call, writes what the stage writes, exits as that stage would.
echo "$PYTHONPATH|$*" >> "$STAND_IN_LOG"
case "$1" in
    benchmarks/gpu_session_results.py) exec "$REAL_PYTHON" "$@" ;;
    benchmarks/cifar_files.py) mkdir -p "$3/cifar-10-batches-py" ;;
    -m) run=""; prev=""
        for arg in "$@"; do [[ $prev == --run-dir ]] && run=$arg; prev=$arg; done
        mkdir -p "$run/checkpoints"; echo x > "$run/checkpoints/ckpt-0000019400.pt"
        echo '{"epoch": 200}' > "$run/metrics.jsonl"
        echo '{"timing": {"cuda_graphs": {"captured": ["full", "last"]}}}' > "$run/summary.json"
        echo "$END_LINE" ;;
    benchmarks/gpu.py) echo '{"sides": {"captured": {"train_images_per_s": 50000.0}},
        "ratios": {"captured_vs_reference": 7.5}, "stages": [{"stage": "round:3"}]}' > "$3"
        exit 124 ;;  # as if stopped at its cap
    tests/unit/train/gpu_check.py) echo '{"ok": false,
        "checks": {"nccl": {"status": "PASS"}, "resume": {"status": "FAIL", "why": "exit 1"}}}' > "$3"
        exit 1 ;;
    benchmarks/gpu_pack.py) echo '{"k": 4, "mps": "started", "packed_vs_alone": 2.5, "variants": {}}' > "$3" ;;
esac
"""


def _session(tmp_path: Path, *args: str, session_s: int = 560,
             script: Path = SCRIPT) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run ``script`` with the stand-in as ``PYTHON`` (or, when ``script`` is a copy, as its repository's
    ``.venv/bin/python``, with no ``PYTHON`` set)."""
    from hpc_train.train.observe.progress import end_line

    tmp_path.mkdir(parents=True, exist_ok=True)
    stand_in = tmp_path / "python3" if script == SCRIPT else script.parents[1] / ".venv" / "bin" / "python"
    stand_in.parent.mkdir(parents=True, exist_ok=True)
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env = {**env, **({"PYTHON": str(stand_in)} if script == SCRIPT else {}), "REAL_PYTHON": sys.executable,
           "GPU_SESSION_S": str(session_s),
           "GPU_SESSION_WORK": str(tmp_path / "work"), "STAND_IN_LOG": str(tmp_path / "calls.log"),
           "END_LINE": end_line({"epochs": 200, "wall_s": 41.04, "train_images_per_s": 61234.5,
                                 "eval_images_per_s": 1234567.0, "setup_s": 3.21})}
    proc = subprocess.run(["bash", str(script), *args, str(out)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    lines = [json.loads(x) for x in (out / "session.jsonl").read_text().splitlines()] if out.exists() else []
    return proc, lines


def test_the_session_runs_every_stage_in_order_within_its_cap(tmp_path):
    proc, lines = _session(tmp_path)
    assert proc.returncode == 1, proc.stderr  # bench stopped at its cap, gpu_check failed: the session says so
    assert [json.loads(x) for x in proc.stdout.splitlines()] == lines  # echoed as written
    assert [x["stage"] for x in lines] == ["data", "recipe", "recipe_result", "bench", "bench_result", "gpu_check",
                                           "gpu_check_result", "pack", "pack_result", "session"]
    runs = {x["stage"]: x for x in lines if "rc" in x}
    assert {name: x["cap_s"] for name, x in runs.items() if name != "session"} == {
        "data": 20, "recipe": 110, "bench": 150, "gpu_check": 150, "pack": 150}
    assert runs["bench"]["timed_out"] is True and runs["gpu_check"]["rc"] == 1 and runs["pack"]["rc"] == 0
    results = {x["stage"]: x for x in lines if x["stage"].endswith("_result")}
    assert results["recipe_result"] == {
        "stage": "recipe_result",
        "end_line": "200 epochs in 41.0 s (train 61,234 img/s, eval 1,234,567 img/s, set-up 3.2 s)",
        "epochs": 200, "seconds": 41.0, "train_img_s": 61234, "eval_img_s": 1234567, "setup_s": 3.2,
        "epochs_evaluated": 200, "cuda_graphs": {"captured": ["full", "last"]}, "checkpoint_stall_ms_max": None}
    assert results["bench_result"]["ratios"] == {"captured_vs_reference": 7.5}
    assert results["bench_result"]["last_stage"] == "round:3"
    assert results["gpu_check_result"]["checks"] == {"nccl": "PASS", "resume": "FAIL"}
    assert results["pack_result"]["packed_vs_alone"] == 2.5 and results["pack_result"]["mps"] == "started"
    # The output folder: a few small files, no folder (what a device session brings back); bulk in the work folder.
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_bench.json", "gpu_check.json", "gpu_pack.json", "logs.tar.gz",
                                                     "session.jsonl"]
    with tarfile.open(out / "logs.tar.gz") as archive:
        names = archive.getnames()
    assert {"logs/recipe.log", "logs/bench.log", "recipe-run/metrics.jsonl"} <= set(names)
    assert not [n for n in names if n.endswith(".pt")]
    calls = (tmp_path / "calls.log").read_text()
    work = tmp_path / "work"
    assert f"benchmarks/cifar_files.py --root {work}/data" in calls
    # The speed recipe, whose own switches are bf16, channels_last and the captured step (nothing overridden)
    assert (f"-m hpc_train.train jobs/cifar10_lt_ldam_drw_fast.yaml --set train.data.root={work}/data --run-dir "
            f"{work}/recipe-run\n") in calls
    assert "benchmarks/gpu.py --out" in calls and "--budget-s 140 --compile-reserve-s 80" in calls
    assert "--k 4 --epochs 3 --timeout-s 45" in calls and "no-submitit" not in calls


def test_only_and_the_deadline_choose_the_stages(tmp_path):
    proc, lines = _session(tmp_path / "a", "--only", "gpu_check")
    assert [x["stage"] for x in lines] == ["gpu_check", "gpu_check_result", "session"]
    proc, lines = _session(tmp_path / "b", "--only", "recipe")  # recipe regenerates its data
    assert proc.returncode == 0 and [x["stage"] for x in lines] == ["data", "recipe", "recipe_result", "session"]
    proc, lines = _session(tmp_path / "c", session_s=25)  # less than 20 s left for every stage: none starts
    assert proc.returncode == 1 and [x["stage"] for x in lines[:-1]] == ["data", "recipe", "bench", "gpu_check", "pack"]
    assert all("session deadline" in x["skipped"] for x in lines[:-1])
    assert not (tmp_path / "c" / "calls.log").exists()
    proc, lines = _session(tmp_path / "d", "--only", "bench,nope")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "gpu_session.sh: no stage 'nope' (stages: data recipe bench gpu_check pack)"]
    assert not (tmp_path / "d" / "out").exists() and not (tmp_path / "d" / "work").exists()


def test_the_cpu_smoke_mode_runs_without_submitit(tmp_path):
    """--cpu-smoke: submitit cannot be imported, and with no PYTHON given the repository's venv runs the stages."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    for name in ("gpu_session.sh", "gpu_session_results.py"):
        shutil.copy(REPO / "benchmarks" / name, repo / "benchmarks" / name)
    proc, lines = _session(tmp_path, "--cpu-smoke", "--only", "bench", script=repo / "benchmarks" / "gpu_session.sh")
    assert [x["stage"] for x in lines] == ["bench", "bench_result", "session"] and lines[-1]["smoke"] is True
    pythonpath, call = (tmp_path / "calls.log").read_text().splitlines()[0].split("|")
    assert call.endswith("--device cpu --tiny --rounds 1")
    blocked = subprocess.run([sys.executable, "-c", "import submitit"], env={**os.environ, "PYTHONPATH": pythonpath},
                             capture_output=True, text=True)
    assert blocked.returncode == 1 and "submitit is not installed on the GPU machine" in blocked.stderr


def test_gpu_session_script_is_clean_shell():
    """The script parses and passes shellcheck: a typo must not cost a GPU session."""
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
