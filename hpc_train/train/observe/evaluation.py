"""Evaluation: exact per-class counts, accumulated on the device, read by the host once per evaluation.

Each rank evaluates its unpadded strided shard of a split. An in-memory split is normalised on the
device once (:meth:`~.pipeline.Feed.eval_tensors`) and evaluated in slices of ``eval_batch_size``
images (the recipes use the whole 10,000-image CIFAR test split at once); an on-disk split comes through
its DataLoader. Every head (features → logits: the classifier, post-hoc adjustment, the τ grid) adds
its ``[correct, count]`` per class to one int64 table on the device — integer sums, exact in any order
and batching — and one all-reduce sums the tables of all ranks; the host reads them once, when every
split of the evaluation is done. So world sizes 1, 2, 3 and any batch size give identical counts.

Before evaluating, every rank takes rank 0's BatchNorm buffers: every rank evaluates exactly the model
that is saved. The records (``metrics.jsonl``), the best-epoch choice and τ-normalisation are here too.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from ..data.pipeline import Feed
from ..model.batchnorm import broadcast_buffers
from ..model.losses import log_prior, posthoc_adjust, target_mask
from ..model.models import LongTailNet
from ..model.two_stage import TAU_GRID, backbone_buffers, snapshot, tau_heads
from .metrics import summarize
from .tensorboard import write_metrics

log = logging.getLogger("hpc_train.train")

Head = Callable[[Tensor], Tensor]
Counts = tuple[list[int], list[int]]
"""Per-class (correct, count)."""


class Evaluator:
    """Evaluates the trainer's model and keeps the run's best and last records."""

    def __init__(self, model: LongTailNet, feed: Feed, *, num_classes: int, batch_size: int, distributed: bool,
                 autocast: Callable[[], contextlib.AbstractContextManager], train_counts: list[int],
                 posthoc_tau: float | None, run_dir: Path, is_main: bool, tensorboard: bool = False) -> None:
        self.model, self.feed, self.num_classes, self.batch_size = model, feed, num_classes, batch_size
        self.distributed, self.autocast, self.counts = distributed, autocast, train_counts
        self.posthoc_tau, self.run_dir, self.is_main = posthoc_tau, run_dir, is_main
        self.tensorboard = tensorboard
        """Records also go to TensorBoard event files (``train.tensorboard``)."""
        self._log_prior = None if posthoc_tau is None else log_prior(train_counts, torch.float32, feed.device)
        self.best: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self.images = 0
        """Images evaluated in this process, all ranks together (the end-of-run figure)."""

    # ------------------------------------------------------------------------------------------------
    # Counting
    # ------------------------------------------------------------------------------------------------

    def _batches(self, split: str) -> Iterator[tuple[Tensor, Tensor]]:
        if self.feed.data.in_memory:
            x, y = self.feed.eval_tensors(split)
            for start in range(0, len(y), self.batch_size):
                yield x[start:start + self.batch_size], y[start:start + self.batch_size]
        else:
            yield from self.feed.eval_batches(split, self.batch_size)

    @torch.no_grad()
    def evaluate(self, requests: dict[str, dict[str, Head]]) -> dict[str, dict[str, Counts]]:
        """Per-class counts of every head of every split (``{split: {head: (correct, count)}}``), summed
        over ranks; one host read for all of them."""
        model = self.model
        if self.distributed:
            broadcast_buffers(model)  # every rank evaluates the model rank 0 saves
        was_training = model.training
        model.eval()
        tables = []
        for split, heads in requests.items():
            table = torch.zeros(len(heads), 2, self.num_classes, dtype=torch.int64, device=self.feed.device)
            for x, y in self._batches(split):
                with self.autocast():
                    features = model.backbone(x).float()  # once for every head (the tau grid has 21)
                # One-hot rows of the targets (a comparison: no host read, unlike one_hot's range check),
                # weighted by the hits: a boolean selection would make the host wait at every batch.
                per_target = target_mask(y, self.num_classes)
                table[:, 1] += per_target.sum(0)
                for i, head in enumerate(heads.values()):
                    hits = head(features).argmax(dim=1) == y
                    table[i, 0] += (per_target & hits[:, None]).sum(0)
            tables.append(table)
            self.images += len(getattr(self.feed.data, split))  # all ranks' shards together
        everything = torch.cat(tables)
        if self.distributed:
            dist.all_reduce(everything, op=dist.ReduceOp.SUM)
        model.train(was_training)
        values = everything.cpu().tolist()  # the one host read of this evaluation
        out, row = {}, 0
        for split, heads in requests.items():
            out[split] = {name: (values[row + i][0], values[row + i][1]) for i, name in enumerate(heads)}
            row += len(heads)
        return out

    def heads(self) -> dict[str, Head]:
        classifier = self.model.classifier
        heads: dict[str, Head] = {"plain": lambda f: classifier(f.to(classifier.weight.dtype))}
        tau, prior = self.posthoc_tau, self._log_prior
        if tau is not None and prior is not None:
            heads["posthoc"] = lambda f: posthoc_adjust(classifier(f).float(), prior, tau)
        return heads

    # ------------------------------------------------------------------------------------------------
    # Records
    # ------------------------------------------------------------------------------------------------

    @staticmethod
    def record(summary: dict[str, Any], *, epoch: int, global_step: int, phase: str, **extra: Any) -> dict[str, Any]:
        return {"epoch": epoch, "global_step": global_step, "phase": phase, "split": "test",
                **extra, **summary, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def evaluate_and_record(self, *, epoch: int, total_epochs: int, global_step: int, phase: str,
                            has_val: bool) -> dict[str, Any]:
        """Test metrics every evaluation; with a held-out split also its metrics, and the best epoch is
        the one with the best held-out balanced accuracy (classifier-balancing selects on val and reports
        test there; on a balanced held-out split balanced accuracy is its top-1). Without one, the best
        test top-1, as LDAM-DRW reports."""
        heads = self.heads()
        requests = {"test": heads, **({"val": {"plain": heads["plain"]}} if has_val else {})}
        results = self.evaluate(requests)
        record = self.record(summarize(*results["test"]["plain"], self.counts), epoch=epoch, global_step=global_step,
                             phase=phase)
        if "posthoc" in results["test"]:
            record["posthoc"] = {"tau": self.posthoc_tau, **summarize(*results["test"]["posthoc"], self.counts)}
        if has_val:
            held_out = summarize(*results["val"]["plain"], self.counts)
            record["val"] = {k: held_out[k] for k in ("top1", "balanced", "many", "medium", "few")}
        score = (lambda r: r["val"]["balanced"]) if "val" in record else (lambda r: r["top1"])
        if self.best is None or score(record) > score(self.best):
            self.best = record
        self.last = record
        if self.is_main:
            write_metrics(self.run_dir, record, self.tensorboard)
            best = self.best
            log.info("epoch %d/%d %s: top-1 %.2f balanced %.2f many %s medium %s few %s (best: epoch %d, test top-1 "
                     "%.2f, chosen on %s)", epoch, total_epochs, phase, 100 * record["top1"], 100 * record["balanced"],
                     _fmt(record["many"]), _fmt(record["medium"]), _fmt(record["few"]), best["epoch"],
                     100 * best["top1"], "val" if "val" in record else "test")
        return record

    def tau_normalise(self, stage1: dict[str, Any] | None, *, epoch: int, global_step: int) -> dict[str, Any] | None:
        """τ-normalise the stage-1 classifier, evaluated with the stage-1 BatchNorm statistics
        (:mod:`.two_stage`); without cRT stage 1 is the current model. τ is chosen on the held-out split."""
        stage1 = stage1 or snapshot(self.model)
        heads = tau_heads(stage1["classifier"], self.feed.device)
        if heads is None:
            log.warning("two_stage.tau_norm needs a linear classifier; skipped")
            return None
        with backbone_buffers(self.model, stage1["backbone_buffers"]):
            val = self.evaluate({"val": heads})["val"]
            scores = {tau: summarize(*val[str(tau)], self.counts)["balanced"] for tau in TAU_GRID}
            best_tau = max(TAU_GRID, key=lambda tau: (scores[tau], -tau))  # ties: the smaller τ
            test = self.evaluate({"test": {"tau": heads[str(best_tau)]}})["test"]
        record = self.record(summarize(*test["tau"], self.counts), epoch=epoch, global_step=global_step,
                             phase="tau_norm", tau=best_tau, val_balanced={str(k): v for k, v in scores.items()})
        if self.is_main:
            write_metrics(self.run_dir, record, self.tensorboard)
            log.info("tau-normalisation: tau=%.1f chosen on the held-out split (balanced %.2f); test top-1 %.2f",
                     best_tau, 100 * scores[best_tau], 100 * record["top1"])
        return record


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"
