"""The step's op count: aten operators of one training step of the LDAM-DRW recipe, counted on the CPU — the
CPU-measurable proxy of a GPU step's kernel launches (``benchmarks/gpu.py --device cpu --count-ops``).

The recipe (``jobs/cifar10_lt_ldam_drw.yaml``: ResNet-32, cosine classifier, LDAM with DRW, fused SGD) with
``amp: bf16`` and ``channels_last``, as shipped otherwise (no SAM), on CIFAR-shaped data sized for three full
batches and a short last one. One epoch runs through :meth:`Trainer.train_epoch`; the step's guard hook (the one
the tests put :class:`~hpc_train.train.loop.guard.NoHostSync` in) gives every step its own :class:`OpCounter`,
a ``TorchDispatchMode``: it sees every aten operator the step dispatches, forward, backward and optimizer.

Counted: every ``aten`` operator but views (an output that aliases an input: ``view``, ``t``, ``detach``,
``slice``…, and ``_unsafe_view``, which its schema does not mark) and bare allocations (``empty*``), neither of
which computes anything; operators of other namespaces (the ``profiler`` markers ``Optimizer.step`` records)
are not aten and launch nothing: listed apart, not counted. Casts (a ``_to_copy`` or ``copy_``
that changes the dtype) are listed by dtype pair (``cast:float32->bfloat16``) instead of under their
operator. Reported: the second full step (the first one also creates the momentum buffers), checked against
the third (``deterministic``), the first and the short last one, and one evaluation of the test split (the
second: the first uploads and normalises it). The count depends on the code path, not on the values or the
batch size (``--tiny`` runs batch 16 and gives the same counts: see BENCHMARKS.md).

On a GPU one aten operator is one to three kernels (cuDNN's convolution backward is two or three); the count
is a proxy for launches, not a kernel count.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GOAL_OPS_PER_STEP = 300
"""Issue 21's target for the lean step."""

ALLOCATIONS = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
"""Operators that only allocate (no kernel runs): not counted."""


UNMARKED_VIEWS = {"_unsafe_view"}
"""Views whose schema returns a fresh tensor (``reshape`` of a copy ends in one)."""


def is_view(func) -> bool:
    """An operator whose output aliases an input without writing it (its schema says ``Tensor(a)``)."""
    return func.overloadpacket.__name__ in UNMARKED_VIEWS or any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _dtype(t: torch.dtype) -> str:
    return str(t).removeprefix("torch.")


def cast_of(func, args: tuple, out: Any) -> str | None:
    """``src->dst`` when the operator converts a tensor to another dtype, else None."""
    name = func.overloadpacket.__name__
    if name == "_to_copy" and isinstance(out, torch.Tensor) and out.dtype != args[0].dtype:
        return f"{_dtype(args[0].dtype)}->{_dtype(out.dtype)}"
    if name == "copy_" and isinstance(args[1], torch.Tensor) and args[1].dtype != args[0].dtype:
        return f"{_dtype(args[1].dtype)}->{_dtype(args[0].dtype)}"
    return None


class OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while it is active (module docstring: what is counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.excluded: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace != "aten":
            self.excluded[func.namespace] += 1
        elif is_view(func):
            self.excluded["views"] += 1
        elif name in ALLOCATIONS:
            self.excluded["allocations"] += 1
        else:
            cast = cast_of(func, args, out)
            self.by_op[f"cast:{cast}" if cast else name] += 1
        return out

    @property
    def ops(self) -> int:
        return sum(self.by_op.values())

    @property
    def casts(self) -> dict[str, int]:
        return {k.removeprefix("cast:"): v for k, v in sorted(self.by_op.items()) if k.startswith("cast:")}

    def summary(self) -> dict[str, Any]:
        return {"ops": self.ops, "casts": sum(self.casts.values()), "casts_by_dtype": self.casts,
                "by_op": dict(sorted(self.by_op.items(), key=lambda kv: (-kv[1], kv[0]))),
                "excluded": dict(sorted(self.excluded.items()))}


def data_for(batch_size: int):
    """CIFAR-shaped long-tailed data (imbalance factor 10, every class present) of three full batches and a
    short last one: the smallest epoch with a first, two steady and a last step."""
    from benchmarks.common import cifar_lt_counts, cifar_shaped_lt

    for per_class in range(1, 10 * batch_size):
        counts = cifar_lt_counts(per_class, 10, 10.0)
        if min(counts) >= 1 and 3 * batch_size < sum(counts) < 4 * batch_size:
            return cifar_shaped_lt(per_class, imbalance_factor=10, test_per_class=10)
    raise AssertionError(f"no data set size gives 3 full batches of {batch_size} and a short one")


def count_recipe_step(*, tiny: bool = False, run_dir: Path | None = None) -> dict[str, Any]:
    """The op counts of the recipe's step (module docstring), as one JSON-ready dict."""
    from benchmarks import ours

    began = time.perf_counter()
    overrides = {"amp": "bf16", "channels_last": True, **({"batch_size": 16} if tiny else {})}
    spec = ours.recipe_spec(device="cpu", **overrides)
    data = data_for(spec.train.batch_size)
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="hpc-train-op-count-"))
    trainer = ours.build_trainer(spec, data, run_dir)
    counters: list[OpCounter] = []

    def counting() -> OpCounter:
        counters.append(OpCounter())
        return counters[-1]

    trainer.step.guard = counting
    trainer.train_epoch()
    first, full, again, last = counters
    trainer.evaluate("test", trainer.heads())  # uploads and normalises the split once
    with OpCounter() as evaluation:
        trainer.evaluate("test", trainer.heads())
    step = full.summary()
    return {
        "what": "aten ops of one full-batch training step (views, bare allocations and other namespaces excluded)",
        "recipe": "jobs/cifar10_lt_ldam_drw.yaml", "overrides": {"device": "cpu", **overrides},
        "batch_size": spec.train.batch_size, "tiny": tiny, "torch": torch.__version__,
        "ops_per_step": step["ops"], "casts_per_step": step["casts"], "casts_by_dtype": step["casts_by_dtype"],
        "by_op": step["by_op"], "excluded_per_step": step["excluded"],
        "deterministic": full.by_op == again.by_op,
        "first_step_ops": first.ops, "last_batch_ops": last.ops,
        "last_batch_images": len(data.train) - 3 * spec.train.batch_size,
        "ops_per_evaluation": evaluation.ops, "evaluation_by_op": evaluation.summary()["by_op"],
        "goal": {f"ops_per_step <= {GOAL_OPS_PER_STEP}": step["ops"] <= GOAL_OPS_PER_STEP},
        "wall_s": round(time.perf_counter() - began, 1),
    }


def table(report: dict[str, Any], top: int = 12) -> str:
    """A few lines for the terminal."""
    lines = [f"ops_per_step {report['ops_per_step']} (casts {report['casts_per_step']}: "
             + ", ".join(f"{k} {v}" for k, v in report["casts_by_dtype"].items()) + ")",
             f"first step {report['first_step_ops']}, last batch {report['last_batch_ops']}, "
             f"evaluation {report['ops_per_evaluation']}, deterministic {report['deterministic']}"]
    lines += [f"  {n:6d}  {name}" for name, n in list(report["by_op"].items())[:top]]
    return "\n".join(lines)
