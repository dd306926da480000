"""The Trainer: holds the state of one rank's training and receives the config.

One loop serves both stages: epochs ``[0, train.epochs)`` train the whole network, the following
``two_stage.crt_epochs`` re-train a re-initialised classifier on frozen features with class-balanced
sampling (cRT), and τ-normalisation of the stage-1 classifier runs once at the end. The position
``(epoch, step_in_epoch)`` — global batches, the same at every world size — and everything needed to
continue from it go into each checkpoint, so a run resumed from any checkpoint, end of epoch or
mid-epoch after a preemption signal, at the same or another world size, takes the same optimizer steps on
the same batches with the same augmentations as one that never stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import rundir, sync_bn
from ..config import JobSpec, LossConfig, ScheduleConfig, TrainConfig
from ..dist import DistEnv
from ..errors import ConfigError
from . import checkpoint as ckpt
from . import preempt, two_stage
from .batchnorm import broadcast_buffers, synchronise_batchnorm
from .datasets import DataSource
from .losses import CrossEntropy, build_loss, posthoc_adjust
from .metrics import ClassCounter, format_table, group_sizes, plot_per_class, summarize
from .models import LongTailNet, build_model, make_classifier
from .pipeline import Feed
from .samplers import derive_seed, stage_sampler
from .schedule import LrSchedule
from .tensorboard import write_metrics
from .two_stage import TAU_GRID

log = logging.getLogger("hpc_train.train")


@dataclass
class RankContext:
    """Where this rank runs: its place in the job and its device."""

    env: DistEnv
    device: torch.device
    rank: int
    world_size: int
    """Ranks that train together (1 for strategy none/dp)."""
    distributed: bool
    """A process group is up (world size > 1)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def barrier(device: torch.device) -> None:
    """A barrier on this rank's device (NCCL otherwise guesses the device and warns)."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def init_model(cfg: TrainConfig, data: DataSource) -> LongTailNet:
    """The model at step 0: seeded, so every rank (and a test) builds the same initial weights."""
    torch.manual_seed(derive_seed("model", cfg.seed))
    return build_model(cfg.model, num_classes=data.num_classes, in_channels=data.in_channels)


def default_crop_padding(cfg: TrainConfig, data: DataSource) -> int:
    if cfg.data.random_crop_padding is not None:
        return cfg.data.random_crop_padding
    return 1 if data.image_size <= 8 else 4


def default_flip(cfg: TrainConfig, data: DataSource) -> bool:
    return cfg.data.random_flip if cfg.data.random_flip is not None else data.name != "digits-lt"


def scaled_lr(cfg: TrainConfig, lr: float) -> float:
    return lr * cfg.batch_size / cfg.optim.base_batch_size if cfg.optim.scale_lr else lr


class Trainer:
    def __init__(self, spec: JobSpec, ctx: RankContext, data: DataSource, run_dir: Path) -> None:
        t = spec.train
        self.spec, self.cfg, self.ctx, self.data, self.run_dir = spec, t, ctx, data, run_dir
        self.device = ctx.device
        self.counts: list[int] = [int(c) for c in data.train_counts]
        self.total_epochs = t.epochs + t.two_stage.crt_epochs
        self.feed = Feed(data, self.device, rank=ctx.rank, world_size=ctx.world_size, seed=t.seed,
                         crop_padding=default_crop_padding(t, data), flip=default_flip(t, data),
                         channels_last=t.channels_last, num_workers=t.data.num_workers,
                         color_jitter=t.data.color_jitter)

        model = init_model(t, data)
        self.batchnorm = sync_bn.decide(t.sync_bn, world_size=ctx.world_size, batch_size=t.batch_size,
                                        strategy=t.strategy)
        if self.batchnorm.on and ctx.distributed:
            model = synchronise_batchnorm(model, self.device)
            if ctx.is_main:
                log.info("BatchNorm %s", self.batchnorm.describe())
        model = model.to(self.device)
        if t.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model: LongTailNet = model
        # Gradients are averaged over the ranks that train together (DDP); the losses scale by it.
        ranks = ctx.world_size if ctx.distributed else 1
        self.criterion = build_loss(t.loss, self.counts, ranks).to(self.device)
        self.crt_criterion = CrossEntropy(self.counts, LossConfig(), ranks).to(self.device)
        self.stage1: dict[str, Any] | None = None
        """The stage-1 classifier and BatchNorm buffers, kept when cRT starts (τ-normalisation uses them)."""
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.amp)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=t.amp == "fp16")

        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.best: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self.phase = ""
        self._saved_at_step = -1
        self._timer_start = time.monotonic()
        self._steps_this_process = 0
        self._last_log = (time.monotonic(), 0)

        resumed = ckpt.load_latest(run_dir, map_location="cpu")
        if resumed is None:
            self._setup_phase("main", reinit_classifier=False)
            return
        state, path = resumed
        self.model.load_state_dict(state["model"])
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        self.best, self.last = state.get("best"), state.get("last")
        self.stage1 = state.get("stage1")
        self._setup_phase(state["phase"], reinit_classifier=False)
        if int(state.get("world_size", ctx.world_size)) != ctx.world_size and ctx.is_main:
            # Steps are global batches and augmentations are keyed by global position: nothing changes.
            log.info("checkpoint written by %s ranks, continuing with %d", state.get("world_size"), ctx.world_size)
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        rng = state["rng"]
        if len(rng) == ctx.world_size:
            ckpt.set_rng_state(rng[ctx.rank])
        self._saved_at_step = self.global_step
        log.info("resumed from %s: epoch %d, step %d of the epoch, %d optimizer steps so far",
                 path.name, self.epoch, self.step_in_epoch, self.global_step)

    # ------------------------------------------------------------------------------------------
    # Phases
    # ------------------------------------------------------------------------------------------

    def _setup_phase(self, phase: str, *, reinit_classifier: bool) -> None:
        t = self.cfg
        self.phase = phase
        if phase == "main":
            params = list(self.model.parameters())
            lr, schedule_cfg, epochs = scaled_lr(t, t.optim.lr), t.schedule, t.epochs
            self.phase_start_epoch = 0
        else:  # crt: classifier re-training on frozen features
            if reinit_classifier:
                self.stage1 = two_stage.snapshot(self.model)
                torch.manual_seed(derive_seed("crt", t.seed))
                fresh = make_classifier(self.model.feature_dim, self.data.num_classes, self.model.classifier_kind)
                self.model.classifier = fresh.to(self.device)
            for p in self.model.backbone.parameters():
                p.requires_grad_(False)
            params = list(self.model.classifier.parameters())
            lr, epochs = scaled_lr(t, t.two_stage.crt_lr), t.two_stage.crt_epochs
            schedule_cfg = ScheduleConfig(name="cosine", update=t.two_stage.crt_lr_update)
            self.phase_start_epoch = t.epochs
        self.sampler = stage_sampler(t, self.data.train.labels, self.data.num_classes, phase)
        self.steps_per_epoch = self.sampler.steps_per_epoch(t.batch_size)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"{self.data.name} has no training images")
        self.schedule = LrSchedule(schedule_cfg, lr, epochs)
        if t.optim.name == "sgd":
            self.optimizer: torch.optim.Optimizer = torch.optim.SGD(
                params, lr=lr, momentum=t.optim.momentum, weight_decay=t.optim.weight_decay, nesterov=t.optim.nesterov)
        else:
            self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=t.optim.weight_decay)
        self.train_model = self._wrap(self.model)

    def _wrap(self, model: nn.Module) -> nn.Module:
        t = self.cfg
        wrapped: nn.Module = model
        if t.strategy == "ddp" and self.ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            wrapped = DDP(model, device_ids=ids, output_device=self.device.index if ids else None)
        elif t.strategy == "dp":
            # Legacy single-process DataParallel: scatters each batch over the visible GPUs of this node
            # (on CPU it simply calls the model). Kept for old recipes; DDP is faster.
            wrapped = nn.DataParallel(model)
        if t.compile:
            wrapped = torch.compile(wrapped)
        return wrapped

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    # ------------------------------------------------------------------------------------------
    # Training
    # ------------------------------------------------------------------------------------------

    @property
    def total_steps(self) -> int:
        return self.total_epochs * self.steps_per_epoch

    def fit(self) -> dict[str, Any]:
        t = self.cfg
        self._write_status(rundir.RUNNING)
        if self.global_step == 0 and self.ctx.is_main:
            log.info("training %s: %d epochs (+%d cRT), %d steps per epoch, batch %d (%d per rank x %d ranks)",
                     self.data.name, t.epochs, t.two_stage.crt_epochs, self.steps_per_epoch, t.batch_size,
                     t.batch_size // self.ctx.world_size, self.ctx.world_size)
        while self.epoch < self.total_epochs:
            if self.epoch >= t.epochs and self.phase == "main":
                self._setup_phase("crt", reinit_classifier=True)
            self._train_epoch()
            end_of_phase = self.epoch in (t.epochs, self.total_epochs)
            if self.epoch % t.eval_every_epochs == 0 or end_of_phase:
                self._evaluate_and_record()
            if self.epoch % t.checkpoint_every_epochs == 0 or end_of_phase:
                self.save_checkpoint()
            if self.epoch < self.total_epochs:
                self._check_preemption()
        tau_record = self._tau_normalise() if t.two_stage.tau_norm else None
        return self._finish(tau_record)

    def _train_epoch(self) -> None:
        t = self.cfg
        criterion = self.criterion if self.phase == "main" else self.crt_criterion
        criterion.set_epoch(self.epoch)
        self.train_model.train()
        if self.phase == "crt" and t.two_stage.crt_bn == "frozen":
            self.model.backbone.eval()  # stage 1's BatchNorm statistics (classifier-balancing re-estimates them)
        local_epoch = self.epoch - self.phase_start_epoch
        batches = self.feed.train_batches(self.sampler, self.epoch, t.batch_size, self.step_in_epoch)
        for x, y, y_global in batches:
            lr = self.schedule.lr(local_epoch, self.step_in_epoch, self.steps_per_epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            with self._autocast():
                loss = criterion(self.train_model(x), y, y_global)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            self.step_in_epoch += 1
            self.global_step += 1
            self._steps_this_process += 1
            if self.ctx.is_main and self.global_step % t.log_every_steps == 0:
                self._log_progress(loss, lr)
            if self.global_step % t.preempt_check_every_steps == 0:
                self._check_preemption()
        self.epoch += 1
        self.step_in_epoch = 0

    def _log_progress(self, loss: Tensor, lr: float) -> None:
        now = time.monotonic()
        last_time, last_step = self._last_log
        images_per_s = (self.global_step - last_step) * self.cfg.batch_size / max(now - last_time, 1e-9)
        self._last_log = (now, self.global_step)
        per_step = (now - self._timer_start) / max(self._steps_this_process, 1)
        eta_s = int(per_step * (self.total_steps - self.global_step))
        log.info("epoch %d/%d step %d/%d loss %.4f lr %.5f img/s %.0f eta %d:%02d:%02d",
                 self.epoch + 1, self.total_epochs, self.step_in_epoch, self.steps_per_epoch, loss.item(), lr,
                 images_per_s, eta_s // 3600, eta_s // 60 % 60, eta_s % 60)

    # ------------------------------------------------------------------------------------------
    # Preemption and checkpoints
    # ------------------------------------------------------------------------------------------

    def _agree(self, *flags: bool) -> list[bool]:
        """Element-wise OR of flags over all ranks (one all-reduce)."""
        if not self.ctx.distributed:
            return list(flags)
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [bool(v) for v in t.tolist()]

    def _check_preemption(self) -> None:
        stop, by_requeue_signal = self._agree(preempt.requested(), preempt.requeue_requested())
        if not stop:
            return
        mine = preempt.received()
        log.warning("preemption signal (%s) — checkpointing at epoch %d step %d",
                    ",".join(mine) if mine else "on another rank", self.epoch, self.step_in_epoch)
        path = self.save_checkpoint()
        s = self.spec.slurm
        requeued, message = False, ""
        if self.ctx.is_main:
            decision = preempt.decide_requeue(requeue_enabled=s.requeue, max_requeues=s.max_requeues,
                                              by_requeue_signal=by_requeue_signal)
            if decision.requeue and decision.job_id:
                requeued, message = preempt.requeue(decision.job_id)
            else:
                message = f"not requeued: {decision.reason}"
        requeued = self._agree(requeued)[0]  # rank 0's outcome, on every rank
        if requeued:
            summary = f"checkpoint {path.name} written; job requeued ({message or 'by rank 0'})"
        else:
            summary = (f"checkpoint {path.name} written, run stopped ({message or 'see rank 0'}); continue it "
                       f"with: hpc-train submit --resume {self.run_dir}")
        self._write_status(rundir.REQUEUED if requeued else rundir.PREEMPTED,
                           exit_code=rundir.EXIT_OK if requeued else rundir.EXIT_CHECKPOINTED)
        if self.ctx.is_main:
            log.warning(summary)
        raise preempt.Preempted(requeued=requeued, message=summary, checkpoint=str(path))

    def _gather_rng(self) -> list[dict[str, Any]]:
        mine = ckpt.rng_state()
        if not self.ctx.distributed:
            return [mine]
        every: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(every, mine)
        return every

    def save_checkpoint(self) -> Path:
        """All ranks take part (RNG states are gathered); rank 0 writes; returns the path."""
        path = ckpt.checkpoint_path(self.run_dir, self.global_step)
        if self._saved_at_step == self.global_step:
            return path
        rng = self._gather_rng()
        if self.ctx.distributed:
            broadcast_buffers(self.model)  # the BatchNorm statistics saved are the ones every rank uses
        self.sampler.epoch, self.sampler.step = self.epoch, self.step_in_epoch
        if self.ctx.is_main:
            state = {
                "format": ckpt.FORMAT_VERSION, "phase": self.phase, "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "steps_per_epoch": self.steps_per_epoch, "world_size": self.ctx.world_size,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                "scheduler": self.schedule.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": rng, "best": self.best, "last": self.last, "train_counts": self.counts,
                "stage1": self.stage1,
            }
            ckpt.save_atomic(state, path)
            ckpt.prune(self.run_dir, self.cfg.keep_checkpoints)
        if self.ctx.distributed:
            barrier(self.device)
        self._saved_at_step = self.global_step
        return path

    # ------------------------------------------------------------------------------------------
    # Evaluation
    # ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, split: str, heads: dict[str, Callable[[Tensor], Tensor]]) -> dict[str, tuple[list, list]]:
        """Per-class [correct, count] of each head (features → logits) on this rank's unpadded shard of
        ``split``, summed over ranks in one all-reduce."""
        model = self.model
        if self.ctx.distributed:
            broadcast_buffers(model)  # every rank evaluates the model rank 0 saves
        was_training = model.training
        model.eval()
        table = torch.zeros(len(heads), 2, self.data.num_classes, dtype=torch.int64, device=self.device)
        counters = [ClassCounter(self.data.num_classes, self.device) for _ in heads]
        for x, y in self.feed.eval_batches(split, self.cfg.eval_batch_size):
            with self._autocast():
                features = model.backbone(x)
            for counter, head in zip(counters, heads.values()):
                counter.update(head(features.float()).argmax(dim=1), y)
        for i, counter in enumerate(counters):
            table[i] = counter.table
        if self.ctx.distributed:
            dist.all_reduce(table, op=dist.ReduceOp.SUM)
        model.train(was_training)
        out = table.cpu().tolist()
        return {name: (out[i][0], out[i][1]) for i, name in enumerate(heads)}

    def _heads(self) -> dict[str, Callable[[Tensor], Tensor]]:
        classifier = self.model.classifier
        heads: dict[str, Callable[[Tensor], Tensor]] = {"plain": lambda f: classifier(f.to(classifier.weight.dtype))}
        tau = self.cfg.loss.posthoc_tau
        if tau is not None:
            heads["posthoc"] = lambda f: posthoc_adjust(classifier(f).float(), self.counts, tau)
        return heads

    def _record(self, summary: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"epoch": self.epoch, "global_step": self.global_step, "phase": self.phase, "split": "test",
                **extra, **summary, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def _evaluate_and_record(self) -> None:
        """Test metrics every evaluation; with a held-out split also its metrics, and the best epoch is
        the one with the best held-out balanced accuracy (classifier-balancing selects on val and reports
        test there; on a balanced held-out split balanced accuracy is its top-1). Without one, the best
        test top-1, as LDAM-DRW reports."""
        results = self.evaluate("test", self._heads())
        record = self._record(summarize(*results["plain"], self.counts))
        if "posthoc" in results:
            record["posthoc"] = {"tau": self.cfg.loss.posthoc_tau, **summarize(*results["posthoc"], self.counts)}
        if self.data.val is not None:
            held_out = summarize(*self.evaluate("val", {"plain": self._heads()["plain"]})["plain"], self.counts)
            record["val"] = {k: held_out[k] for k in ("top1", "balanced", "many", "medium", "few")}
        score = (lambda r: r["val"]["balanced"]) if "val" in record else (lambda r: r["top1"])
        if self.best is None or score(record) > score(self.best):
            self.best = record
        self.last = record
        if self.ctx.is_main:
            write_metrics(self.run_dir, record, self.cfg.tensorboard)
            log.info("epoch %d/%d %s: top-1 %.2f balanced %.2f many %s medium %s few %s (best: epoch %d, test top-1 "
                     "%.2f, chosen on %s)", self.epoch, self.total_epochs, self.phase, 100 * record["top1"],
                     100 * record["balanced"], _fmt(record["many"]), _fmt(record["medium"]), _fmt(record["few"]),
                     self.best["epoch"], 100 * self.best["top1"], "val" if "val" in record else "test")

    def _tau_normalise(self) -> dict[str, Any] | None:
        """τ-normalise the stage-1 classifier, evaluated with the stage-1 BatchNorm statistics
        (:mod:`.two_stage`); without cRT stage 1 is the current model."""
        stage1 = self.stage1 or two_stage.snapshot(self.model)
        heads = two_stage.tau_heads(stage1["classifier"], self.device)
        if heads is None:
            log.warning("two_stage.tau_norm needs a linear classifier; skipped")
            return None
        with two_stage.backbone_buffers(self.model, stage1["backbone_buffers"]):
            val = self.evaluate("val", heads)
            scores = {tau: summarize(*val[str(tau)], self.counts)["balanced"] for tau in TAU_GRID}
            best_tau = max(TAU_GRID, key=lambda tau: (scores[tau], -tau))  # ties: the smaller τ
            test = self.evaluate("test", {"tau": heads[str(best_tau)]})
        self.phase = "tau_norm"
        record = self._record(summarize(*test["tau"], self.counts), tau=best_tau,
                              val_balanced={str(k): v for k, v in scores.items()})
        if self.ctx.is_main:
            write_metrics(self.run_dir, record, self.cfg.tensorboard)
            log.info("tau-normalisation: tau=%.1f chosen on the held-out split (balanced %.2f); test top-1 %.2f",
                     best_tau, 100 * scores[best_tau], 100 * record["top1"])
        return record

    # ------------------------------------------------------------------------------------------
    # The end
    # ------------------------------------------------------------------------------------------

    def _finish(self, tau_record: dict[str, Any] | None) -> dict[str, Any]:
        def brief(r: dict[str, Any] | None) -> dict[str, Any] | None:
            if r is None:
                return None
            keys = ("epoch", "phase", "tau", "top1", "balanced", "many", "medium", "few", "per_class", "val")
            return {k: r[k] for k in keys if k in r}

        summary = {
            "run_dir": str(self.run_dir), "dataset": self.data.name, "num_classes": self.data.num_classes,
            "epochs": self.total_epochs, "global_step": self.global_step, "world_size": self.ctx.world_size,
            "train_counts": self.counts, "group_sizes": group_sizes(self.counts),
            "best": brief(self.best), "last": brief(self.last), "tau_norm": brief(tau_record),
            "posthoc": (self.last or {}).get("posthoc"), "table": None,
        }
        if self.ctx.is_main:
            chosen = " on val" if "val" in (self.best or {}) else ""
            rows = {f"best{chosen} (ep {self.best['epoch']})": self.best, "last": self.last} if self.best else {}
            if summary["posthoc"]:
                rows[f"post-hoc tau={summary['posthoc']['tau']:g}"] = summary["posthoc"]
            if tau_record:
                rows[f"tau-norm {tau_record['tau']:.1f}"] = tau_record
            summary["table"] = (f"{self.data.name}: accuracy (%) on the test split; many >100 / medium / "
                                f"few <20 training images\n" + format_table(rows, self.counts))
            print("\n" + summary["table"], flush=True)
            final = tau_record or self.last
            if final is not None:
                plot_per_class(self.run_dir / "per_class_accuracy.png", final["per_class"], self.counts,
                               f"{self.data.name}: per-class accuracy ({final['phase']})")
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        self._write_status(rundir.COMPLETED, exit_code=rundir.EXIT_OK)
        return summary

    def _write_status(self, state: str, exit_code: int | None = None) -> None:
        """Rank 0 records the run's state and progress in the run directory (its owner: hpc_train.rundir)."""
        if not self.ctx.is_main:
            return
        instance, restart = rundir.instance_of()
        rundir.append_event(self.run_dir, state, writer="trainer", instance=instance, restart=restart,
                            epoch=self.epoch, step_in_epoch=self.step_in_epoch, global_step=self.global_step,
                            total_epochs=self.total_epochs, exit_code=exit_code)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"
