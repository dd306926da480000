"""The Trainer: holds the state of one rank's training and runs its loop.

One loop serves both stages: epochs ``[0, train.epochs)`` train the whole network, the following
``two_stage.crt_epochs`` re-train a re-initialised classifier on frozen features with class-balanced
sampling (cRT), and τ-normalisation of the stage-1 classifier runs once at the end. The position
``(epoch, step_in_epoch)`` — global batches, the same at every world size — and everything needed to
continue from it go into each checkpoint, so a run resumed from any checkpoint, end of epoch or
mid-epoch after a preemption signal, at the same or another world size, takes the same optimizer steps on
the same batches with the same augmentations as one that never stopped.

The Trainer owns the run's state (model, optimizer, position) and reads as the loop: :meth:`Trainer.fit` runs
:meth:`~Trainer.fit_epoch` until the last epoch, each of which is :meth:`~Trainer.train_epoch` then the epoch
boundary. The jobs around the loop are objects it composes, each owning its own state: the step (:mod:`.step`,
:mod:`.lean`, :mod:`.sam`) and its CUDA graphs (:mod:`.graphs`), the epoch's learning rates
(:class:`~.schedule.EpochRates`), the epoch boundary with its checkpoint clock, pending evaluation and
preemption (:mod:`.boundary`), evaluation (:mod:`.evaluation`, in the background: :mod:`.overlap`), checkpoint
capture and restore (:mod:`.checkpointer`), the agreement between ranks (:mod:`.control`) and the progress lines
and end-of-run report (:mod:`.progress`). The host does not wait for the GPU inside an epoch nor between epochs:
losses are read behind the steps, ranks agree on the CPU, an epoch's evaluation is read when the next one ends.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import torch

from ...config import JobSpec, ScheduleConfig
from ...config.sync_bn import decide as batchnorm_decision
from ...config.plugins import is_import_path
from ...errors import ConfigError
from ...runs import rundir
from ..data.datasets import DataSource
from ..data.pipeline import EpochPlan, Feed, default_crop_padding, default_flip
from ..data.samplers import derive_seed, stage_sampler
from ..model import two_stage
from ..model.batchnorm import broadcast_buffers, synchronise_batchnorm
from ..model.losses import build_loss
from ..model.models import LongTailNet, init_model
from ..observe import progress as progress_lines
from ..observe.evaluation import Evaluator, Head
from ..observe.pulse import Pulse
from ..state import checkpoint as ckpt
from ..state.best_held_out import BestHeldOut
from ..state.checkpointer import Checkpointer
from . import graphs
from .boundary import EpochBoundary, Position, RunStatus
from .context import RankContext
from .control import Agreement
from .schedule import EpochRates, LrSchedule, reads_tensor_lr, scaled_lr
from .step import StepState, assemble_step, build_optimizer

log = logging.getLogger("hpc_train.train")


def stored_dtype(cfg, amp_dtype: torch.dtype | None) -> torch.dtype:
    """What in-memory images are stored in: the AMP dtype where the model's first layer (a convolution of a
    built-in model) casts its input to it anyway — bit for bit the same values, half the bytes, no cast per
    step — else float32. A plug-in model's first operation is unknown, and mixup computes with the images
    before that cast (bf16 would round them three times): float32."""
    lossless = amp_dtype is not None and not is_import_path(cfg.model.name) and not cfg.mixup_alpha
    return amp_dtype if lossless else torch.float32


class Trainer:
    """One rank's training: it owns what a checkpoint holds (:meth:`state_dict`) and runs the loop (:meth:`fit`);
    the objects it composes are handed what they need once (module docstring)."""

    def __init__(self, spec: JobSpec, ctx: RankContext, data: DataSource, run_dir: Path) -> None:
        t = spec.train
        self.spec, self.cfg, self.ctx, self.data, self.run_dir = spec, t, ctx, data, run_dir
        self.device = ctx.device
        self.counts: list[int] = [int(c) for c in data.train_counts]
        self.total_epochs = t.epochs + t.two_stage.crt_epochs
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.amp)
        self.feed = Feed(data, self.device, rank=ctx.rank, world_size=ctx.world_size, seed=t.seed,
                         crop_padding=default_crop_padding(t, data), flip=default_flip(t, data),
                         channels_last=t.channels_last, num_workers=t.data.num_workers,
                         color_jitter=t.data.color_jitter, mixup_alpha=t.mixup_alpha,
                         dtype=stored_dtype(t, self.amp_dtype))
        if t.mixup_alpha and not data.in_memory:
            raise ConfigError(f"train.mixup_alpha mixes in-memory data sets; {data.name} streams from disk: set it to 0")

        self.batchnorm = batchnorm_decision(t, ctx.world_size)
        self.model: LongTailNet = self._placed_model()
        # Gradients are averaged over the ranks that train together (DDP); the losses scale by it.
        ranks = ctx.world_size if ctx.distributed else 1
        self.criterion = build_loss(t.loss, self.counts, ranks).to(self.device)
        self.crt_criterion = build_loss(t.two_stage.crt_loss, self.counts, ranks).to(self.device)
        self.stage1: dict[str, Any] | None = None
        """The stage-1 classifier and BatchNorm buffers, kept when cRT starts (τ-normalisation uses them)."""
        self.max_norm: two_stage.MaxNorm | None = None
        """Weight balancing's MaxNorm of stage 2 (``two_stage.crt_max_norm``), its radius fixed when stage 2 starts."""
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=t.amp == "fp16")

        self.captured, self.graphs_reason = graphs.decide(t, self.device, world_size=ctx.world_size,
                                                          in_memory=data.in_memory)
        if ctx.is_main and self.device.type == "cuda":
            log.info("%s", self.graphs_reason)
        if t.compile:
            graphs.set_compile_cache(t)
        self.state = StepState.on(self.device)
        self.rates = EpochRates(self.device)
        self.agreement = Agreement(ctx.distributed, timeout_s=t.process_group_timeout_s)
        self.checkpointer = Checkpointer(run_dir, self.device, keep=t.keep_checkpoints, writer=ctx.is_main,
                                         train_state=self)
        self.best_held_out = BestHeldOut(run_dir, self.checkpointer, self.agreement.barrier, is_main=ctx.is_main)
        self.clock = progress_lines.RunClock(self.device)
        self.evaluator = Evaluator(self.model, self.feed, num_classes=data.num_classes, batch_size=t.eval_batch_size,
                                   distributed=ctx.distributed, autocast=self._autocast, train_counts=self.counts,
                                   posthoc_tau=t.loss.posthoc_tau, run_dir=run_dir, is_main=ctx.is_main,
                                   tensorboard=t.tensorboard, clock=self.clock,
                                   logit_scale=t.loss.ldam_scale if t.model.classifier == "cosine" else 1.0)
        self.progress = progress_lines.Progress(self.device, printing=ctx.is_main)
        self.plan: EpochPlan | None = None
        self._next_tables: dict[tuple[str, int], dict] = {}
        self.runner: graphs.CapturedSteps | None = None
        # heartbeats, compute times per rank (observe/pulse.py)
        self.pulse = Pulse(self.device, self.agreement.group, rank=ctx.rank, world_size=ctx.world_size,
                           hostname=ctx.env.hostname, distributed=ctx.distributed, run_dir=run_dir)
        self.status = RunStatus(run_dir, writer=ctx.is_main)
        self.boundary = EpochBoundary(t, requeue_enabled=spec.slurm.requeue, max_requeues=spec.slurm.max_requeues,
                                      run_dir=run_dir, is_main=ctx.is_main, state=self.state, progress=self.progress,
                                      agreement=self.agreement, pulse=self.pulse, evaluator=self.evaluator,
                                      best_held_out=self.best_held_out, checkpointer=self.checkpointer,
                                      has_val=data.val is not None, status=self.status)

        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.phase = ""

        if self.checkpointer.restore() is None:  # else load_state_dict put this trainer where it left off
            self._setup_phase("main", starting=True)

    def _placed_model(self) -> LongTailNet:
        """The model, its BatchNorm synchronised as decided, on this rank's device in its memory format."""
        t, ctx = self.cfg, self.ctx
        model = init_model(t, self.data)
        bn_kernel = self.batchnorm.kernel(ctx.world_size if ctx.distributed else 1, self.device.type)
        if bn_kernel != "batchnorm":
            model = synchronise_batchnorm(model, bn_kernel)
            if ctx.is_main:
                log.info("BatchNorm %s", self.batchnorm.describe())
        model = model.to(self.device)
        if t.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    @property
    def best(self) -> dict[str, Any] | None:
        """The best evaluation on the held-out split (None without one)."""
        return self.evaluator.best

    @property
    def last(self) -> dict[str, Any] | None:
        return self.evaluator.last

    # ------------------------------------------------------------------------------------------
    # State: what a checkpoint holds (the checkpointer only captures and writes it)
    # ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's training state as live references (the checkpointer copies them). Every rank calls it:
        RNG states are gathered and rank 0's BatchNorm buffers broadcast, so the statistics saved are the ones
        every rank uses."""
        ctx = self.ctx
        rng = ckpt.gather_rng(self.agreement.group if ctx.distributed else None, ctx.world_size)
        if ctx.distributed:
            broadcast_buffers(self.model)
        self.sampler.epoch, self.sampler.step = self.epoch, self.step_in_epoch
        optimizer = self.optimizer.state_dict()
        if reads_tensor_lr(self.optimizer):  # the file keeps the number (the host knows it: nothing is read back)
            lr = self.rates.checkpoint_lr()
            optimizer["param_groups"] = [{**g, "lr": lr} for g in optimizer["param_groups"]]
        return {
            "format": ckpt.FORMAT_VERSION, "phase": self.phase, "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
            "steps_per_epoch": self.steps_per_epoch, "world_size": ctx.world_size,
            "model": self.model.state_dict(), "optimizer": optimizer,
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "scheduler": self.rates.schedule.state_dict(), "sampler": self.sampler.state_dict(),
            "rng": rng, **self.evaluator.state_dict(), "train_counts": self.counts, "stage1": self.stage1,
            "max_norm_radius": None if self.max_norm is None else self.max_norm.radius,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off, in place: nothing a captured step reads moves. The optimizer keeps
        this run's lr tensor and kernel choice (a checkpoint holds the lr as a number, and whatever kernel wrote
        it)."""
        ctx = self.ctx
        self.model.load_state_dict(state["model"])
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        self.evaluator.load_state_dict(state)
        on_disk = self.best_held_out.record_on_disk() if self.data.val is not None else None
        if on_disk is not None and on_disk["global_step"] != (self.evaluator.best_main or {}).get("global_step"):
            self.evaluator.best_main = on_disk  # evaluated after this checkpoint, before a crash: the one to beat
        self.stage1 = state.get("stage1")
        radius = state.get("max_norm_radius")
        self.max_norm = None if radius is None else two_stage.MaxNorm(float(radius))
        self._setup_phase(state["phase"], starting=False)
        if int(state.get("world_size", ctx.world_size)) != ctx.world_size and ctx.is_main:
            # Steps are global batches and augmentations are keyed by global position: nothing changes.
            log.info("checkpoint written by %s ranks, continuing with %d", state.get("world_size"), ctx.world_size)
        keep = [{k: g[k] for k in ("lr", "fused", "foreach", "capturable") if k in g}
                for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, kept in zip(self.optimizer.param_groups, keep):
            group.update(kept)
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        if len(state["rng"]) == ctx.world_size:
            ckpt.set_rng_state(state["rng"][ctx.rank])
        self.boundary.clock.resumed_at(self.global_step)  # a checkpoint now would be this one again

    # ------------------------------------------------------------------------------------------
    # Phases
    # ------------------------------------------------------------------------------------------

    def _setup_phase(self, phase: str, *, starting: bool) -> None:
        """The phase's sampler, schedule, optimizer and step; ``starting``: the phase begins now (not a resume
        into it), so stage 2 first puts stage 1's weights in place and keeps their snapshot."""
        t, two = self.cfg, self.cfg.two_stage
        self.phase, decay = phase, None
        if phase == "main":
            params = list(self.model.parameters())
            lr, schedule_cfg, epochs, first_epoch = scaled_lr(t, t.optim.lr), t.schedule, t.epochs, 0
        else:  # stage 2 (cRT and its relatives): the classifier on frozen features
            if starting:
                torch.manual_seed(derive_seed("crt", t.seed))
                self.stage1 = two_stage.begin_stage_two(self.model, reinit=two.crt_reinit, device=self.device,
                                                        num_classes=self.data.num_classes, loss_name=two.crt_loss.name,
                                                        stage1_weights=self._best_held_out_weights())
                if two.crt_max_norm is not None:
                    self.max_norm = two_stage.MaxNorm.start(self.model.classifier, two.crt_max_norm)
            params = two_stage.freeze_backbone(self.model)
            lr, epochs, decay = scaled_lr(t, two.crt_lr), two.crt_epochs, two.crt_weight_decay
            schedule_cfg, first_epoch = ScheduleConfig(name="cosine", update=two.crt_lr_update), t.epochs
        self.sampler = stage_sampler(t, self.data.train.labels, self.data.num_classes, phase)
        self.steps_per_epoch = self.sampler.steps_per_epoch(t.batch_size)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"{self.data.name} has no training images")
        self.rates.start_phase(LrSchedule(schedule_cfg, lr, epochs), first_epoch=first_epoch)
        self.optimizer = build_optimizer(t, params, self.rates.tensor, captured=self.captured, weight_decay=decay)
        criterion = self.criterion if phase == "main" else self.crt_criterion
        criterion.reserve(t.batch_size, torch.float32, self.device)
        self.train_model, self.step = assemble_step(
            t, self.model, self.ctx, captured=self.captured, criterion=criterion, optimizer=self.optimizer,
            state=self.state, rates=self.rates, counts=self.counts, autocast=self._autocast, scaler=self.scaler,
            main=phase == "main", images=self.feed.train_images() if self.data.in_memory else None, amp_dtype=self.amp_dtype)
        self.pulse.attach(getattr(self.train_model, "_orig_mod", self.train_model))  # the DDP model under compile
        self.plan = None  # the plan's shapes are the phase's
        self.runner = graphs.CapturedSteps(self.step, self.device, agree=self.agreement.agree_all,
                                           before_capture=self.checkpointer.wait,
                                           check=", ".join(graphs.capture_check_required(t)) or None,
                                           warmup=graphs.warmup_steps(self.ctx.world_size)) if self.captured else None

    def _best_held_out_weights(self) -> dict[str, Any] | None:
        """Stage 1's best model on the held-out split, or None without one (stage 2 then starts from the end of
        stage 1)."""
        return None if self.data.val is None else self.best_held_out.weights(self.device)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        # A captured step must not keep autocast's cast-weight cache across replays (PyTorch's notes).
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype, cache_enabled=not self.captured)

    # ------------------------------------------------------------------------------------------
    # Training
    # ------------------------------------------------------------------------------------------

    @property
    def total_steps(self) -> int:
        return self.total_epochs * self.steps_per_epoch

    def position(self) -> Position:
        """Where training stands now (what the epoch boundary and the status record are handed)."""
        return Position(phase=self.phase, epoch=self.epoch, step_in_epoch=self.step_in_epoch,
                        global_step=self.global_step, total_epochs=self.total_epochs)

    def fit(self) -> dict[str, Any]:
        t = self.cfg
        self.clock.begin()
        self.progress.start(self.global_step)
        first_epoch = self.epoch
        self.status.write(rundir.RUNNING, self.position())
        if self.global_step == 0 and self.ctx.is_main:
            log.info("training %s: %d epochs (+%d cRT), %d steps per epoch, batch %d (%d per rank x %d ranks)",
                     self.data.name, t.epochs, t.two_stage.crt_epochs, self.steps_per_epoch, t.batch_size,
                     t.batch_size // self.ctx.world_size, self.ctx.world_size)
        if self.ctx.is_main:
            progress_lines.prepare_pictures()
        while self.epoch < self.total_epochs:
            self.fit_epoch()
        self.boundary.settle_evaluation(self.position())  # recorded already by the last checkpoint; none unread
        self.checkpointer.wait()
        tau_record = None
        if t.two_stage.tau_norm:
            if self.stage1 is None:  # no stage 2: the best of stage 1 on the held-out split, without a snapshot yet
                self.model.load_state_dict(self._best_held_out_weights())
            tau_record = self.evaluator.tau_normalise(self.stage1, epoch=self.epoch, global_step=self.global_step)
            self.phase = "tau_norm"
        return self._finish(tau_record, epochs_run=self.total_epochs - first_epoch)

    def fit_epoch(self) -> None:
        """One epoch of :meth:`fit`: its steps, then its end (:meth:`~.boundary.EpochBoundary.end_epoch`: agree,
        evaluate in the background, checkpoint when due, stop if preempted)."""
        if self.epoch >= self.cfg.epochs and self.phase == "main":
            self._setup_phase("crt", starting=True)
        self.train_epoch()
        if self.max_norm is not None and self.phase == "crt":
            self.max_norm.project(self.model.classifier)  # once per epoch, after its steps (weight balancing)
        self.boundary.end_epoch(self.position())

    def train_epoch(self) -> None:
        """The optimizer steps of the current epoch, from ``step_in_epoch`` on."""
        t = self.cfg
        self.step.criterion.set_epoch(self.epoch)  # DRW: the class weights switch in place
        self.progress.begin_epoch()
        self.train_model.train()
        if self.phase == "crt" and t.two_stage.crt_bn == "frozen":
            self.model.backbone.eval()  # stage 1's BatchNorm statistics (classifier-balancing re-estimates them)
        start = self.step_in_epoch
        self.rates.start_epoch(self.epoch, self.steps_per_epoch, start)
        self.state.start_at(start)
        self.clock.start("train")
        if self.data.in_memory:
            made = self._next_tables.pop((self.phase, self.epoch), None)
            self.plan = self.step.plan = self.feed.epoch_plan(self.sampler, self.epoch, t.batch_size, out=self.plan,
                                                              tables=made, with_mixup=self.phase == "main")
            for step in range(start, self.steps_per_epoch):
                kind = "full" if step < self.plan.full_steps else "last"
                if self.runner is not None:
                    self.runner.run(kind)
                else:
                    self.step.body(kind)
                self._after_step()
            if self.epoch + 1 < (t.epochs if self.phase == "main" else self.total_epochs):
                # The next epoch's tables, made on the CPU while the GPU works through this one's steps.
                self._next_tables = {(self.phase, self.epoch + 1): self.feed.plan_tables(
                    self.sampler, self.epoch + 1, t.batch_size, with_mixup=self.phase == "main")}
        else:
            for x, y, y_global in self.feed.train_batches(self.sampler, self.epoch, t.batch_size, start):
                self.step.compute(x, y, y_global)
                self._after_step()
        self.clock.stop("train", max(0, self.sampler.num_samples - start * t.batch_size))
        self.epoch += 1
        self.step_in_epoch = 0

    def _after_step(self) -> None:
        """The host's share of a step: count it, a progress line every ``log_every_steps``, the ranks' agreement
        every ``preempt_check_every_steps``."""
        t = self.cfg
        lr = self.rates.took(self.step_in_epoch)
        self.step_in_epoch += 1
        self.global_step += 1
        if self.global_step % t.log_every_steps == 0:
            self.progress.step_line(self.state, epoch=self.epoch, total_epochs=self.total_epochs,
                                    step=self.step_in_epoch, steps=self.steps_per_epoch, global_step=self.global_step,
                                    total_steps=self.total_steps, batch=t.batch_size, lr=lr)
        elif self.device.type == "cuda":
            self.progress.flush(wait=False)
        if self.global_step % t.preempt_check_every_steps == 0:
            self.boundary.check_step(self.position())

    def save_checkpoint(self, *, wait: bool = True) -> Path:
        """A checkpoint of the state now (:meth:`~.boundary.EpochBoundary.save_checkpoint`); its path."""
        return self.boundary.save_checkpoint(self.position(), wait=wait)

    # ------------------------------------------------------------------------------------------
    # Evaluation now, and the end
    # ------------------------------------------------------------------------------------------

    def heads(self) -> dict[str, Head]:
        return self.evaluator.heads()

    def evaluate(self, split: str, heads: dict[str, Head]) -> dict[str, tuple[list, list]]:
        """Per-class [correct, count] of each head on ``split``, summed over ranks, now (one host read)."""
        return self.evaluator.evaluate({split: heads})[split]

    def _finish(self, tau_record: dict[str, Any] | None, *, epochs_run: int) -> dict[str, Any]:
        timing = {**self.clock.timing(epochs_run),
                  **graphs.graph_facts(self.captured, self.graphs_reason, self.runner, compiled=self.cfg.compile),
                  "checkpoint_stall_ms_max": round(1000 * max(self.checkpointer.stall_s, default=0.0), 2)}
        summary = progress_lines.finish(
            run_dir=self.run_dir, data_name=self.data.name, num_classes=self.data.num_classes,
            total_epochs=self.total_epochs, global_step=self.global_step, world_size=self.ctx.world_size,
            counts=self.counts, best=self.best, last=self.last, best_on_test=self.evaluator.best_on_test,
            tau_record=tau_record, timing=timing, is_main=self.ctx.is_main)
        self.status.write(rundir.COMPLETED, self.position(), exit_code=rundir.EXIT_OK)
        self.pulse.beat(global_step=self.global_step, epoch=self.epoch, phase="done", force=True)
        return summary
