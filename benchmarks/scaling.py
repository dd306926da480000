"""7. Scaling on paper: gradient bytes per step, all-reduce time, predicted DDP efficiency.

Nothing here is timed. The parameter counts are counted from the models; everything else follows from
the model below and the inputs it names (each cited or derived, never measured here — no GPU cluster).

* Gradient bytes per step: 4 bytes × parameters (DDP all-reduces fp32 gradients, also under bf16 AMP,
  unless a compression hook is installed; none is).
* All-reduce time, N nodes × 8 GPUs, n = 8N ranks: ring all-reduce, bandwidth term only,
  t = 2(n-1)/n × bytes / B with B the node's network bandwidth (25 or 100 Gb/s), because for N ≥ 2 every
  ring crosses the network; on one node the ring stays on NVLink/PCIe, which this model takes as free
  (efficiency 1 by assumption). Latency (α per ring step, 2(n-1) steps) is left out: it matters for
  ResNet-32's small 1.9 MB message and makes this model optimistic there.
* Efficiency (weak scaling, fixed batch per GPU): t_compute / (t_compute + exposed communication),
  bounded by two overlap assumptions — none (all-reduce after the backward pass; what DDP does when all
  gradients fit one bucket, as ResNet-32's do — see the DDP benchmark's bucket sizes) and full (the
  all-reduce hides behind the backward pass, 2/3 of the step's FLOPs: exposed = max(0, t_ar - 2/3 t_c)).
* t_compute per step: ResNet-50, 64 images per GPU at 2,150 img/s per A100 (AMP + channels_last;
  pytorch/pytorch#82699) = 29.8 ms. ResNet-32, 128 images per
  GPU (one recipe batch per GPU) × 412 MFLOPs per image forward+backward (torch's flop_counter) at
  94 TFLOP/s, airbench94's effective rate on an A100 (0.36 PFLOPs in 3.83 s) — an upper
  bound for ResNet-32's narrow convolutions, so its t_compute (0.56 ms) is a lower bound and its
  efficiency a lower bound too.
"""

from __future__ import annotations

from typing import Any

NODES = (1, 2, 4, 8, 16, 32)
GPUS_PER_NODE = 8
BANDWIDTHS_GBIT = (25, 100)
BACKWARD_SHARE = 2 / 3  # 412 MFLOPs fwd+bwd vs 137.7 MFLOPs fwd per ResNet-32 image (torch.utils.flop_counter)

RESNET50_IMAGES_PER_S = 2150.0  # A100, AMP, channels_last (pytorch#82699)
RESNET50_BATCH_PER_GPU = 64
RESNET32_FLOPS_PER_IMAGE = 412e6  # forward + backward (torch.utils.flop_counter)
RESNET32_BATCH_PER_GPU = 128
AIRBENCH94_FLOPS_PER_S = 0.36e15 / 3.83  # A100 (airbench94: 0.36 PFLOPs in 3.83 s)


def parameter_counts() -> dict[str, int]:
    from torchvision.models import resnet50

    from hpc_train.config import ModelConfig
    from hpc_train.train.model.models import build_model

    def count(m) -> int:
        return sum(p.numel() for p in m.parameters())

    return {"resnet32": count(build_model(ModelConfig(name="resnet32"), num_classes=10, in_channels=3)),
            "resnet50": count(resnet50(weights=None))}


def all_reduce_s(nbytes: float, nodes: int, gbit_per_s: float) -> float:
    if nodes == 1:
        return 0.0
    n = nodes * GPUS_PER_NODE
    return 2 * (n - 1) / n * nbytes * 8 / (gbit_per_s * 1e9)


def efficiency(t_compute: float, t_ar: float, overlap: bool) -> float:
    exposed = max(0.0, t_ar - BACKWARD_SHARE * t_compute) if overlap else t_ar
    return t_compute / (t_compute + exposed)


def run() -> dict[str, Any]:
    params = parameter_counts()
    compute_s = {"resnet32": RESNET32_BATCH_PER_GPU * RESNET32_FLOPS_PER_IMAGE / AIRBENCH94_FLOPS_PER_S,
                 "resnet50": RESNET50_BATCH_PER_GPU / RESNET50_IMAGES_PER_S}
    models: dict[str, Any] = {}
    for name, p in params.items():
        rows = []
        for nodes in NODES:
            for bw in BANDWIDTHS_GBIT:
                t_ar = all_reduce_s(4 * p, nodes, bw)
                rows.append({"nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "gbit_per_s": bw,
                             "all_reduce_ms": 1000 * t_ar,
                             "efficiency_no_overlap": efficiency(compute_s[name], t_ar, False),
                             "efficiency_full_overlap": efficiency(compute_s[name], t_ar, True)})
        models[name] = {"parameters": p, "gradient_bytes": 4 * p, "compute_ms_per_step": 1000 * compute_s[name],
                        "rows": rows}
    models["resnet32"]["compute_source"] = ("derived: 128 img x 412 MFLOPs at airbench94's 94 TFLOP/s on an A100 "
                                            "(an upper bound on the rate)")
    models["resnet50"]["compute_source"] = "cited: 64 img at 2,150 img/s per A100, AMP + channels_last (pytorch#82699)"
    return {"model": "ring all-reduce, bandwidth term 2(n-1)/n x bytes / B over the node NIC; one node free",
            "models": models}


def markdown(result: dict[str, Any]) -> str:
    lines = []
    for name, m in result["models"].items():
        lines.append(f"**{name}**: {m['parameters']:,} parameters, {m['gradient_bytes'] / 1e6:.2f} MB of fp32 "
                     f"gradients per step; compute per step {m['compute_ms_per_step']:.2f} ms ({m['compute_source']}).")
        lines.append("")
        lines.append("| nodes × 8 GPUs | all-reduce 25 Gb/s (ms) | efficiency 25 Gb/s (no / full overlap) "
                     "| all-reduce 100 Gb/s (ms) | efficiency 100 Gb/s (no / full overlap) |")
        lines.append("|---|---|---|---|---|")
        by = {(r["nodes"], r["gbit_per_s"]): r for r in m["rows"]}
        for nodes in NODES:
            a, b = by[(nodes, 25)], by[(nodes, 100)]
            lines.append(f"| {nodes} × 8 = {nodes * 8} | {a['all_reduce_ms']:.2f} | "
                         f"{100 * a['efficiency_no_overlap']:.0f}% / {100 * a['efficiency_full_overlap']:.0f}% | "
                         f"{b['all_reduce_ms']:.2f} | {100 * b['efficiency_no_overlap']:.0f}% / "
                         f"{100 * b['efficiency_full_overlap']:.0f}% |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(markdown(run()))
