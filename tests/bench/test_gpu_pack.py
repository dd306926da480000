"""The GPU packing stage (benchmarks/gpu_pack.py) runs end to end on CPUs: K runs started together by the pack
runner, each measured from its own progress lines (the figure itself needs one H200: see BENCHMARKS.md)."""

import json

from benchmarks import gpu_pack


def test_the_packing_stage_runs_on_cpu(tmp_path, capsys, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text("{}\n")
    monkeypatch.setenv("HPC_TRAIN_SITE", str(site))
    monkeypatch.chdir(tmp_path)
    assert gpu_pack.main(["--device", "cpu", "--tiny", "--k", "2", "--epochs", "2", "--out", str(tmp_path / "o.json")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    alone, packed, summary = lines
    assert alone["runs"] == 1 and packed["runs"] == 2 and all(v > 0 for v in packed["img_s_per_run"])
    assert summary["packed_vs_alone"] == round(packed["aggregate_img_s"] / alone["aggregate_img_s"], 2)
