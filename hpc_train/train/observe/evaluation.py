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

The headline is the last evaluation. "Best" is chosen on the held-out split only (best held-out balanced
accuracy, its test numbers reported); the epoch with the best *test* top-1 — what LDAM-DRW and MiSLAS print
as "Best Prec@1", a choice made on the test split — is kept only under its own name, ``best_on_test``.
Calibration: the expected calibration error of the test split (MiSLAS's ``utils/metric.py``,
``calibration``: 15 equal-width bins of the top softmax probability, Σ_b |acc_b - conf_b|·n_b / N), from
per-bin counts summed over ranks like the per-class ones.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ..data.pipeline import Feed
from ..model.batchnorm import broadcast_buffers
from ..model.losses import log_prior, posthoc_adjust, target_mask
from ..model.models import LongTailNet
from ..model.two_stage import TAU_GRID, backbone_buffers, snapshot, tau_heads
from .metrics import ECE_BINS, expected_calibration_error, summarize
from .overlap import Background, Result, Snapshot
from .progress import RunClock
from .tensorboard import write_metrics

log = logging.getLogger("hpc_train.train")

Head = Callable[[Tensor], Tensor]
Counts = tuple[list[int], list[int]]
"""Per-class (correct, count)."""


@dataclass
class Launched:
    """An evaluation under way: its result on its way to the host, which heads of which split it holds."""

    result: Result
    heads: dict[str, list[str]]
    calibrate: str | None


@dataclass
class Pending:
    """An epoch's evaluation started in the background (:meth:`Evaluator.begin`): the snapshot it evaluates (the
    weights of that epoch: what a best held-out snapshot saves) and what its record will say."""

    launched: Launched
    model: LongTailNet
    meta: dict[str, Any]


class Evaluator:
    """Evaluates the trainer's model and keeps the run's last, best (held-out) and best-on-test records."""

    def __init__(self, model: LongTailNet, feed: Feed, *, num_classes: int, batch_size: int, distributed: bool,
                 autocast: Callable[[], contextlib.AbstractContextManager], train_counts: list[int],
                 posthoc_tau: float | None, run_dir: Path, is_main: bool, tensorboard: bool = False,
                 logit_scale: float = 1.0, clock: RunClock | None = None) -> None:
        self.model, self.feed, self.num_classes, self.batch_size = model, feed, num_classes, batch_size
        self.distributed, self.autocast, self.counts = distributed, autocast, train_counts
        self.posthoc_tau, self.run_dir, self.is_main = posthoc_tau, run_dir, is_main
        self.tensorboard = tensorboard
        """Records also go to TensorBoard event files (``train.tensorboard``)."""
        self.logit_scale = logit_scale
        """What the plain head's logits are multiplied by before the softmax of the calibration error (the
        cosine classifier's logits lie in [-1, 1]; its loss scales them by ``ldam_scale``)."""
        self._log_prior = None if posthoc_tau is None else log_prior(train_counts, torch.float32, feed.device)
        # MiSLAS's bin edges, np.linspace(0, 1, 16) (torch.linspace may round an edge differently)
        self._ece_edges = torch.from_numpy(np.linspace(0.0, 1.0, ECE_BINS + 1)).to(feed.device)
        self.best: dict[str, Any] | None = None
        """The evaluation with the best held-out balanced accuracy (None without a held-out split)."""
        self.best_main: dict[str, Any] | None = None
        """The same among stage 1's evaluations: the snapshot stage 2 and τ-normalisation start from."""
        self.best_on_test: dict[str, Any] | None = None
        """The evaluation with the best test top-1 (chosen on test: reported only under this name)."""
        self.last: dict[str, Any] | None = None
        self.improved_main = False
        """The last evaluation improved :attr:`best_main` (the trainer then writes the snapshot)."""
        self.images = 0
        """Images evaluated in this process, all ranks together (the end-of-run figure)."""
        self.clock = clock
        """Times each evaluation's span where it runs (its stream on a GPU)."""
        self.snapshot = Snapshot()
        self.background = Background(feed.device, overlap=not distributed)
        """Where evaluations run (a stream of their own on one GPU) and how their results come back
        (:mod:`.overlap`)."""

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
    def _count(self, requests: dict[str, dict[str, Head]], model: LongTailNet,
               calibrate: str | None) -> list[Tensor]:
        """The device side of an evaluation: per-head ``[correct, count]`` per class of every split and the
        calibration bins, summed over ranks (device tensors; nothing read back)."""
        was_training = model.training
        model.eval()
        tables = []
        bins = torch.zeros(2, ECE_BINS, dtype=torch.int64, device=self.feed.device)  # [count, correct] per bin
        confidence = torch.zeros(ECE_BINS, dtype=torch.float64, device=self.feed.device)
        images = 0
        if self.clock is not None:
            self.clock.start("eval")  # on the stream the work runs on
        for split, heads in requests.items():
            table = torch.zeros(len(heads), 2, self.num_classes, dtype=torch.int64, device=self.feed.device)
            for x, y in self._batches(split):
                with self.autocast():
                    features = model.backbone(x).float()  # once for every head (the tau grid has 21)
                # One-hot rows of the targets (a comparison: no host read, unlike one_hot's range check),
                # weighted by the hits: a boolean selection would make the host wait at every batch.
                per_target = target_mask(y, self.num_classes)
                table[:, 1] += per_target.sum(0)
                for i, (name, head) in enumerate(heads.items()):
                    logits = head(features)
                    hits = logits.argmax(dim=1) == y
                    table[i, 0] += (per_target & hits[:, None]).sum(0)
                    if split == calibrate and name == "plain":
                        self._calibration(logits, hits, bins, confidence)
            tables.append(table)
            images += len(getattr(self.feed.data, split))  # all ranks' shards together
        everything = torch.cat(tables)
        if self.distributed:
            dist.all_reduce(everything, op=dist.ReduceOp.SUM)
            if calibrate is not None:
                dist.all_reduce(bins, op=dist.ReduceOp.SUM)
                dist.all_reduce(confidence, op=dist.ReduceOp.SUM)
        model.train(was_training)
        self.images += images
        if self.clock is not None:
            self.clock.stop("eval", images)
        return [everything, bins, confidence]

    def launch(self, requests: dict[str, dict[str, Head]], calibrate: str | None = None,
               model: LongTailNet | None = None) -> Launched:
        """Start an evaluation of ``model`` (the trainer's own, its buffers first taken from rank 0, unless given:
        the background snapshot) through :attr:`background`; :meth:`collect` reads it."""
        if model is None:
            model = self.model
            if self.distributed:
                broadcast_buffers(model)  # every rank evaluates the model rank 0 saves
        result = self.background.submit(lambda: self._count(requests, model, calibrate))
        return Launched(result, {split: list(heads) for split, heads in requests.items()}, calibrate)

    def collect(self, launched: Launched) -> dict[str, dict[str, Counts]]:
        """Per-class counts of every head of every split (``{split: {head: (correct, count)}}``) of a launched
        evaluation: the one host read of it (waiting only if its copy has not landed yet)."""
        everything, bins, confidence = launched.result.get()
        values = everything.tolist()
        out, row = {}, 0
        for split, heads in launched.heads.items():
            out[split] = {name: (values[row + i][0], values[row + i][1]) for i, name in enumerate(heads)}
            row += len(heads)
        if launched.calibrate is not None:
            count, correct = bins.tolist()
            out[launched.calibrate]["ece"] = expected_calibration_error(count, correct, confidence.tolist())
        return out

    def evaluate(self, requests: dict[str, dict[str, Head]],
                 calibrate: str | None = None) -> dict[str, dict[str, Counts]]:
        """Per-class counts of every head of every split of the trainer's model, now (:meth:`launch` and
        :meth:`collect`), summed over ranks; one host read for all of them. ``calibrate``: a split whose ``plain``
        head's calibration error goes in as ``{"ece": value}`` of that split."""
        return self.collect(self.launch(requests, calibrate))

    def _calibration(self, logits: Tensor, hits: Tensor, bins: Tensor, confidence: Tensor) -> None:
        count, correct, summed = calibration_bins(logits, hits, self._ece_edges, self.logit_scale)
        bins[0] += count
        bins[1] += correct
        confidence += summed

    def heads(self, model: LongTailNet | None = None) -> dict[str, Head]:
        classifier = (model or self.model).classifier
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

    def begin(self, *, epoch: int, total_epochs: int, global_step: int, phase: str, has_val: bool) -> Pending:
        """Start the evaluation of this epoch in the background (:mod:`.overlap`): the model's weights and buffers
        copied into the snapshot, which is evaluated while training goes on; :meth:`finish` records it."""
        if self.distributed:
            broadcast_buffers(self.model)  # every rank evaluates (and saves) the model rank 0 saves
        self.background.before_writing()  # the previous evaluation has read the snapshot
        model = self.snapshot.refresh(self.model)
        heads = self.heads(model)
        requests = {"test": heads, **({"val": {"plain": heads["plain"]}} if has_val else {})}
        return Pending(self.launch(requests, calibrate="test", model=model), model,
                       dict(epoch=epoch, total_epochs=total_epochs, global_step=global_step, phase=phase))

    def finish(self, pending: Pending) -> dict[str, Any]:
        """Record an evaluation :meth:`begin` started. Test metrics (with the calibration error) every evaluation;
        with a held-out split also its metrics, and the best evaluation is the one with the best held-out
        balanced accuracy (classifier-balancing selects on val and reports test there; on a long-tailed held-out
        split balanced accuracy estimates the balanced test top-1 better). The best test top-1 is kept as
        ``best_on_test``."""
        results = self.collect(pending.launched)
        epoch, total_epochs, phase = pending.meta["epoch"], pending.meta["total_epochs"], pending.meta["phase"]
        record = self.record(summarize(*results["test"]["plain"], self.counts), epoch=epoch,
                             global_step=pending.meta["global_step"], phase=phase)
        record["ece"] = results["test"]["ece"]
        if "posthoc" in results["test"]:
            record["posthoc"] = {"tau": self.posthoc_tau, **summarize(*results["test"]["posthoc"], self.counts)}
        if "val" in results:
            held_out = summarize(*results["val"]["plain"], self.counts)
            record["val"] = {k: held_out[k] for k in ("top1", "balanced", "many", "medium", "few")}
        self._choose(record, phase)
        if self.is_main:
            write_metrics(self.run_dir, record, self.tensorboard)
            chosen = (f"best on held-out: epoch {self.best['epoch']}, test top-1 {100 * self.best['top1']:.2f}"
                      if self.best is not None else
                      f"best_on_test: epoch {self.best_on_test['epoch']}, top-1 {100 * self.best_on_test['top1']:.2f}")
            log.info("epoch %d/%d %s: top-1 %.2f balanced %.2f many %s medium %s few %s ECE %s (%s)", epoch,
                     total_epochs, phase, 100 * record["top1"], 100 * record["balanced"], _fmt(record["many"]),
                     _fmt(record["medium"]), _fmt(record["few"]), _fmt(record["ece"]), chosen)
        return record

    def evaluate_and_record(self, *, epoch: int, total_epochs: int, global_step: int, phase: str,
                            has_val: bool) -> dict[str, Any]:
        """:meth:`begin` and :meth:`finish` at once (the record now)."""
        return self.finish(self.begin(epoch=epoch, total_epochs=total_epochs, global_step=global_step, phase=phase,
                                      has_val=has_val))

    def _choose(self, record: dict[str, Any], phase: str) -> None:
        """Last, best on the held-out split (and among stage 1's), best on test."""
        self.last = record
        if self.best_on_test is None or record["top1"] > self.best_on_test["top1"]:
            self.best_on_test = record
        self.improved_main = False
        if "val" not in record:
            return
        score = record["val"]["balanced"]
        if self.best is None or score > self.best["val"]["balanced"]:
            self.best = record
        if phase == "main" and (self.best_main is None or score > self.best_main["val"]["balanced"]):
            self.best_main, self.improved_main = record, True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_main": self.best_main, "best_on_test": self.best_on_test, "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("best", "best_main", "best_on_test", "last"):
            setattr(self, key, state.get(key))
        if self.best is not None and "val" not in self.best:  # a checkpoint from before best_on_test: chosen on test
            self.best_on_test, self.best = self.best_on_test or self.best, None

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


def calibration_bins(logits: Tensor, hits: Tensor, edges: Tensor,
                     logit_scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """Per bin of the top softmax probability: images, correct predictions (``hits``) and summed probabilities.
    Bin b holds probabilities in (edges[b], edges[b + 1]], as ``np.digitize(conf, np.linspace(0, 1, 16),
    right=True)`` puts them in MiSLAS's ``calibration`` (a probability of 0 falls in none); comparisons, no
    host read."""
    top = torch.softmax(logits.float() * logit_scale, dim=1).amax(dim=1).double()
    which = torch.bucketize(top, edges, right=False)  # 1 .. len(edges) - 1 for (0, 1]
    in_bin = which[:, None] == torch.arange(1, len(edges), device=which.device)[None, :]
    return in_bin.sum(0), (in_bin & hits[:, None]).sum(0), (in_bin.double() * top[:, None]).sum(0)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"
