"""benchmarks/gpu.py, the GPU benchmark stage, where no GPU is: its order, and its CPU smoke run end to end
(the figures themselves need one H200: see BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import gpu
from benchmarks.common import REPO, child_env


class _Side:
    """Stands in for a side of the benchmark (ours or the reference): its epochs take no time. Trusted only
    for the order in which the sides are set up and timed, which is all it shows."""

    def __init__(self, name: str) -> None:
        self.name = name

    def epoch(self, clock) -> dict:
        return {"train_s": 0.5, "eval_s": 0.1, "epoch_s": 0.6, "images": 100, "eval_images": 10}


def _stages(monkeypatch, tmp_path, budget_s: float, reserve_s: float) -> tuple[list[str], dict]:
    import argparse
    import types

    import torch

    monkeypatch.setattr(gpu, "Ours", lambda name, *a, **k: _Side(name))
    monkeypatch.setattr(gpu, "Reference", lambda *a, **k: _Side("reference"))
    monkeypatch.setattr(gpu, "_have", lambda module: True)
    args = argparse.Namespace(budget_s=budget_s, compile_reserve_s=reserve_s, rounds=2, tiny=True, out=None,
                              variants="compiled_captured,eager,captured", ref_workers=0)
    bench = gpu.Bench(args, torch.device("cpu"))
    bench.device = types.SimpleNamespace(type="cuda")  # the GPU's order of sides, with no GPU
    gpu._run_sides(bench, data=None, work=tmp_path)
    return [entry["stage"] for entry in bench.report["stages"]], bench.report["skipped"]


def test_the_compiled_variant_is_set_up_only_after_the_others_are_timed(monkeypatch, tmp_path, capsys):
    """The reference, eager and captured sides are set up and timed before the compiled one starts, and it
    starts only with --compile-reserve-s left: its cold compile (about a minute) once took the whole stage
    and left no timed figure at all."""
    stages, skipped = _stages(monkeypatch, tmp_path, budget_s=100, reserve_s=50)
    assert stages == ["first_epoch:eager", "first_epoch:captured", "first_epoch:reference", "round:1", "round:2",
                      "first_epoch:compiled_captured", "round:compiled_captured:1", "round:compiled_captured:2"]
    assert skipped == {}
    stages, skipped = _stages(monkeypatch, tmp_path, budget_s=100, reserve_s=200)
    assert stages == ["first_epoch:eager", "first_epoch:captured", "first_epoch:reference", "round:1", "round:2"]
    assert list(skipped) == ["compiled_captured"] and "time budget" in skipped["compiled_captured"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["stage"] == "round:2"  # a line per stage


def test_gpu_script_runs_end_to_end_on_cpu(tmp_path):
    """benchmarks/gpu.py in its smoke mode (CPU, a few hundred images): every stage prints its JSON line
    as it ends, the report has the figures the GPU run would fill in, says the goals do not apply, and
    names the variants that run on the GPU only."""
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--tiny", "--rounds", "1",
                           "--out", str(out)], cwd=REPO,
                          env=child_env(HPC_TRAIN_SITE=str(tmp_path / "site.yaml"), OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = [json.loads(line)["stage"] for line in proc.stdout.splitlines() if line.startswith('{"stage"')]
    assert stages == ["data", "first_epoch:eager", "first_epoch:reference", "round:1", "done"], stages
    report = json.loads(out.read_text())
    assert report["measured"] and set(report["sides"]) == {"eager", "reference"}
    assert set(report["skipped"]) == {"captured", "compiled_captured"}
    for side in report["sides"].values():
        assert side["train_images_per_s"] > 0 and side["projected_200_epochs_s"] > 0
    assert "eager_vs_reference" in report["ratios"]
    assert isinstance(report["goals"], str) and "not applicable" in report["goals"]
