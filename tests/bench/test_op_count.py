"""The op count (benchmarks/op_count.py, ``gpu.py --device cpu --count-ops``): the CPU proxy of the GPU step's
kernel launches that the lean-step work is measured by, so it must count exactly what it says it counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from benchmarks.common import REPO, child_env  # noqa: E402
from benchmarks.op_count import OpCounter  # noqa: E402


def test_the_counter_counts_a_known_step_exactly():
    """A step whose aten operators are known one by one (PyTorch's autograd formulas: sum's backward expands
    the seed, mul's multiplies by the other factor, a cast's casts back; AccumulateGrad detaches)."""
    w = torch.nn.Parameter(torch.full((2, 3), 0.5))
    optimizer = torch.optim.SGD([w], lr=torch.tensor(0.1), momentum=0.9, fused=True)
    with OpCounter() as counter:
        x = torch.arange(6.0).view(2, 3)              # arange; view (a view)
        wide = torch.empty(2, 3, dtype=torch.float64)  # empty (an allocation)
        wide.copy_(x)                                  # copy_ float32 -> float64: a cast
        y = (w.to(torch.bfloat16) * x.to(torch.bfloat16)).float()  # 2 casts, mul, a cast back
        y.sum().backward()  # sum; ones_like (the seed), expand (a view), cast, mul, cast, detach (a view)
        optimizer.step()    # empty_like (the momentum buffer: an allocation), _fused_sgd_, 2 profiler markers
        x.t().reshape(-1).add_(1)  # t (a view), clone (reshape of a transposed tensor), _unsafe_view, add_
    assert counter.summary() == {
        "ops": 14, "casts": 6,
        "casts_by_dtype": {"bfloat16->float32": 2, "float32->bfloat16": 3, "float32->float64": 1},
        "by_op": {"cast:float32->bfloat16": 3, "cast:bfloat16->float32": 2, "mul": 2, "_fused_sgd_": 1, "add_": 1,
                  "arange": 1, "cast:float32->float64": 1, "clone": 1, "ones_like": 1, "sum": 1},
        "excluded": {"allocations": 2, "profiler": 2, "views": 5},
    }
    with OpCounter() as same_dtype:
        torch.zeros(3).copy_(torch.ones(3))  # a copy, not a cast
    assert same_dtype.by_op == {"zeros": 1, "ones": 1, "copy_": 1}


def test_count_ops_counts_the_recipes_step_on_cpu(tmp_path):
    """``gpu.py --device cpu --count-ops`` (batch 16 with --tiny: the count does not depend on the batch size)
    runs and reports a step of the recipe: one convolution and one BatchNorm forward and backward per layer of
    ResNet-32, the casts within the total, the same count at two steps."""
    from benchmarks import ours
    from hpc_train.train.model.models import build_model

    out = tmp_path / "ops.json"
    proc = subprocess.run([sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--count-ops", "--tiny",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=child_env(HPC_TRAIN_SITE=str(tmp_path / "site.yaml"), OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert proc.stdout.startswith(f"ops_per_step {report['ops_per_step']} (casts {report['casts_per_step']}")
    model = build_model(ours.recipe_spec().train.model, num_classes=10, in_channels=3)
    layers = {kind: sum(isinstance(m, kind) for m in model.modules())
              for kind in (torch.nn.Conv2d, torch.nn.BatchNorm2d)}
    by_op = report["by_op"]
    assert by_op["convolution"] == by_op["convolution_backward"] == layers[torch.nn.Conv2d]
    assert by_op["native_batch_norm"] == by_op["native_batch_norm_backward"] == layers[torch.nn.BatchNorm2d]
    assert report["ops_per_step"] == sum(by_op.values()) and report["deterministic"] is True
    assert report["casts_per_step"] == sum(report["casts_by_dtype"].values()) == sum(
        n for name, n in by_op.items() if name.startswith("cast:")) > 0
    assert report["overrides"] == {"device": "cpu", "amp": "bf16", "channels_last": True, "batch_size": 16}
    assert 0 < report["ops_per_evaluation"] < report["ops_per_step"]
    # The lean step (issue 21): within its goal, and no weight cast per layer — the one cast each way left is the
    # float32 classifier's input (the pooled bf16 features) and its gradient.
    assert report["goal"] == {"ops_per_step <= 300": True} and report["ops_per_step"] <= 300
    assert report["casts_by_dtype"] == {"bfloat16->float32": 1, "float32->bfloat16": 1}
    assert by_op["_foreach_copy_"] == 2 and by_op["_foreach_add_"] == 1  # the copy's grads and refresh; BN counters


def test_count_ops_refuses_the_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/gpu.py", "--count-ops"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=child_env(HPC_TRAIN_SITE=str(tmp_path / "site.yaml")))
    assert proc.returncode == 2 and proc.stderr.strip() == "gpu.py: --count-ops counts on the CPU: add --device cpu"
