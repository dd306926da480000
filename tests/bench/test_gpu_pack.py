"""The GPU packing stage (benchmarks/gpu_pack.py) runs end to end on CPUs: K runs started together by the pack
runner, each measured from its own progress lines (the figure itself needs one H200: see BENCHMARKS.md); and
its MPS daemon, which cannot exist here, is stood in for by scripts of the control command's name: they show
that a daemon that fails or does not answer is reported, not waited for — not that the real one starts."""

import json
import os
import time

from benchmarks import gpu_pack


def test_the_packing_stage_runs_on_cpu(tmp_path, capsys, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o.json"
    assert gpu_pack.main(["--device", "cpu", "--tiny", "--k", "2", "--epochs", "2", "--work", str(tmp_path / "w"),
                          "--out", str(out)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    alone, packed, summary = lines
    assert alone["runs"] == 1 and packed["runs"] == 2 and all(v > 0 for v in packed["img_s_per_run"])
    assert summary["packed_vs_alone"] == round(packed["aggregate_img_s"] / alone["aggregate_img_s"], 2)
    report = json.loads(out.read_text())
    assert report["packed_vs_alone"] == summary["packed_vs_alone"] and set(report["variants"]) == {"alone", "packed"}
    assert report["mps"].startswith("not started") and "packed_mps" in report["skipped"]
    assert (tmp_path / "w" / "packed" / "point-1" / "logs" / "rank-0.log").exists()  # --work keeps the logs


def test_an_mps_daemon_that_fails_or_hangs_is_reported_not_waited_for(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpu_pack, "MPS_TIMEOUT_S", 1)
    control.write_text("#!/bin/sh\necho 'An instance of this daemon is already running'\nexit 1\n")
    control.chmod(0o755)
    env, note = gpu_pack.mps_env(tmp_path)
    assert env is None and note.startswith("not started") and "exited 1: An instance" in note, note
    control.write_text("#!/bin/sh\nexec sleep 30\n")
    started = time.monotonic()
    env, note = gpu_pack.mps_env(tmp_path)
    assert env is None and "TimeoutExpired" in note and time.monotonic() - started < 5, note
    control.write_text("#!/bin/sh\nexit 0\n")
    env, note = gpu_pack.mps_env(tmp_path)
    assert note == "started" and env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps-pipe")
    assert gpu_pack.stop_mps(env) == "stopped"
    control.unlink()
    assert gpu_pack.mps_env(tmp_path) == (None, "not started: nvidia-cuda-mps-control not on PATH")
