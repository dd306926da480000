"""The captured-step formulation, run on the CPU: the step CUDA graphs replay, checked where no GPU is.

* Bit for bit main's loop: the trainer's step — epoch tables on the device indexed by a device position,
  a tensor lr read by fused SGD, DRW weights switched in place, the non-finite flag — gives exactly the
  weights of the engine it replaced (its loop written out below from the same building blocks: a
  host-fed batch, a float lr, the for-loop SGD), over epochs with warm-up, two milestones, the DRW switch
  and a one-image last batch every epoch; every step runs under the dispatcher guard.
* The same through the graph bookkeeping (warm-up, capture, replay, the fallback after a failed capture),
  with a fake that records each captured step and replays it.
* A run stopped mid-epoch by a signal and resumed on that path ends with the uninterrupted weights.
* Phase changes: the DRW switch updates what a captured step reads in place (same storage, new values);
  cRT starts a new set of graphs on a new optimizer.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hpc_train.rank import preempt  # noqa: E402
from hpc_train.rank.dist import DistEnv  # noqa: E402
from hpc_train.runs import rundir  # noqa: E402
from hpc_train.train.data import datasets
from hpc_train.train.data.pipeline import default_crop_padding, default_flip  # noqa: E402
from hpc_train.train.loop import graphs
from hpc_train.train.loop.context import RankContext  # noqa: E402
from hpc_train.train.loop.engine import Trainer  # noqa: E402
from hpc_train.train.loop.guard import HostSyncError, NoHostSync  # noqa: E402
from hpc_train.train.model.models import init_model  # noqa: E402
from hpc_train.train.state import checkpoint as ckpt  # noqa: E402

from .helpers import deep_update, digits_lt_counts, make_spec  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_intraop_thread")  # tests/conftest.py says why


RECIPE = {
    "epochs": 5, "batch_size": 32, "log_every_steps": 4, "keep_checkpoints": 20, "eval_every_epochs": 5,
    "data": {"name": "digits-lt", "imbalance_factor": 20},  # 417 images: 13 batches of 32 and one of 1
    "model": {"name": "small_cnn", "classifier": "cosine"},
    "loss": {"name": "ldam", "drw_epoch": 3},
    "optim": {"lr": 0.05, "weight_decay": 5e-4},
    "schedule": {"name": "multistep", "warmup_epochs": 1, "milestones": [2, 4], "gamma": 0.1},
}
STEPS = 14


def _main_loop(spec) -> dict:
    """Main's engine (51e3fae) at world size 1, written out from the building blocks it used: batches
    handed over by ``Feed.train_batches``, the lr set as a float on every group, ``torch.optim.SGD`` with
    its default (for-loop) kernel on the CPU, zero_grad / backward / step; with ``amp`` the forward pass and
    the loss under plain autocast (it casts every weight in every pass), the images in float32."""
    import contextlib

    from hpc_train.train.data.pipeline import Feed
    from hpc_train.train.data.samplers import stage_sampler
    from hpc_train.train.loop.schedule import LrSchedule
    from hpc_train.train.model.losses import build_loss

    t = spec.train
    data = datasets.load(t.data)
    model = init_model(t, data)
    if t.channels_last:
        model = model.to(memory_format=torch.channels_last)
    amp = {"bf16": torch.bfloat16}.get(t.amp)
    autocast = (lambda: torch.autocast("cpu", dtype=amp)) if amp else contextlib.nullcontext
    feed = Feed(data, torch.device("cpu"), rank=0, world_size=1, seed=t.seed,
                crop_padding=default_crop_padding(t, data), flip=default_flip(t, data),
                channels_last=t.channels_last, num_workers=0)
    criterion = build_loss(t.loss, [int(c) for c in data.train_counts], 1)
    sampler = stage_sampler(t, data.train.labels, data.num_classes, "main")
    steps = sampler.steps_per_epoch(t.batch_size)
    schedule = LrSchedule(t.schedule, t.optim.lr, t.epochs)
    optimizer = torch.optim.SGD(model.parameters(), lr=t.optim.lr, momentum=t.optim.momentum,
                                weight_decay=t.optim.weight_decay, nesterov=t.optim.nesterov)
    model.train()
    for epoch in range(t.epochs):
        criterion.set_epoch(epoch)
        for step, (x, y, y_global) in enumerate(feed.train_batches(sampler, epoch, t.batch_size)):
            lr = schedule.lr(epoch, step, steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with autocast():
                loss = criterion(model(x), y, y_global)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.state_dict()


class _CaptureView:
    """What ``torch.accelerator`` tells code during a capture on a CUDA stream: the accelerator is CUDA and its
    stream is capturing. torch's optimizers read exactly this for their capture health check
    (torch/optim/optimizer.py, ``_accelerator_graph_capture_health_check``), so a step taken under this view
    passes or fails torch's own check, as under ``torch.cuda.graph``."""

    def is_capturing(self) -> bool:
        return True


def capturing():
    from unittest import mock

    return mock.patch.multiple(torch.accelerator,
                               current_accelerator=lambda check_available=False: torch.device("cuda"),
                               current_stream=lambda device=None: _CaptureView())


class FakeGraph:
    """A 'captured' step. The capture ran it once, under :func:`capturing` (torch's health checks see a capture),
    standing in for the replay that follows every capture; every later replay runs it again."""

    def __init__(self, body) -> None:
        self.body, self.ran_at_capture = body, True

    def replay(self) -> None:
        if self.ran_at_capture:  # the replay right after the capture: the capture already ran the step
            self.ran_at_capture = False
            return
        self.body()


class _Stream:
    def wait_stream(self, other) -> None:
        pass


class FakeGraphs:
    """Stands in for :class:`graphs.CudaGraphs` on the CPU; ``fail``: every capture raises."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.captures = fail, []

    def stream(self, device):
        return _Stream()

    current = stream

    def on(self, stream):
        import contextlib

        return contextlib.nullcontext()

    def capture(self, body, stream):
        """Fails before running anything (``fail``), or runs the step under :func:`capturing`. Unlike a real
        capture, a step that raises part-way has run part-way: only failures before the step are faithful."""
        self.captures.append(body)
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        with capturing():
            body()
        return FakeGraph(body)


def _trainer(spec, run_dir: Path, *, guard: bool = True) -> Trainer:
    data = datasets.load(spec.train.data)
    ctx = RankContext(env=DistEnv.from_environ(), device=torch.device("cpu"), rank=0, world_size=1, distributed=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(spec, ctx, data, run_dir)
    if guard:
        _guard_steps(trainer)
    return trainer


def _guard_steps(trainer: Trainer) -> None:
    """Every step of every phase of ``trainer`` runs under :class:`NoHostSync`."""
    setup = trainer._setup_phase

    def guarded(*args, **kwargs):
        setup(*args, **kwargs)
        trainer.step.guard = NoHostSync

    trainer._setup_phase = guarded
    trainer.step.guard = NoHostSync


def _final_weights(run_dir: Path) -> dict:
    return ckpt.load_latest(run_dir)[0]["model"]


def _different(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(scope="module")
def main_weights():
    assert sum(digits_lt_counts(20)) == 13 * 32 + 1  # a one-image last batch every epoch
    return _main_loop(make_spec(RECIPE))


def test_the_step_formulation_gives_mains_weights_bit_for_bit(tmp_path, main_weights, monkeypatch):
    trainer = _trainer(make_spec(RECIPE), tmp_path / "eager")
    assert trainer.runner is None and trainer.steps_per_epoch == STEPS
    assert trainer.train_model.module is trainer.model  # world size 1: no DDP wrapper (the lean forward only)
    trainer.fit()
    assert not _different(_final_weights(tmp_path / "eager"), main_weights)
    # The same steps through warm-up / capture / replay (a fake that replays the recorded step).
    fake = FakeGraphs()
    monkeypatch.setattr(graphs, "BACKEND", fake)
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    trainer = _trainer(make_spec(RECIPE), tmp_path / "graphs")
    trainer.fit()
    assert sorted(trainer.runner.graphs) == ["full", "last"] and len(fake.captures) == 2
    # World size 1: one warm-up step per shape. full: 13 an epoch, 1 warm-up step, 1 capture (replayed at once);
    # last: one an epoch, warmed up in epoch 1, captured in epoch 2
    assert trainer.runner.warmup == 1 and trainer.runner.replays == {"full": 5 * 13 - 1, "last": 5 - 1}
    assert not _different(_final_weights(tmp_path / "graphs"), main_weights)
    # Not vacuous: the DRW switch and the milestones change the result.
    moved = _main_loop(make_spec(deep_update(RECIPE, loss={"name": "ldam", "drw_epoch": 4})))
    assert _different(moved, main_weights)


def test_a_failed_capture_falls_back_to_eager_steps_with_one_line(tmp_path, main_weights, monkeypatch, caplog):
    monkeypatch.setattr(graphs, "BACKEND", FakeGraphs(fail=True))
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    trainer = _trainer(make_spec(RECIPE), tmp_path / "run")
    with caplog.at_level("WARNING", logger="hpc_train.train"):
        trainer.fit()
    lines = [r.getMessage() for r in caplog.records if "capturing the" in r.getMessage()]
    assert len(lines) == 1 and "training continues with eager steps" in lines[0], lines
    assert trainer.runner.failed and not trainer.runner.graphs
    assert not _different(_final_weights(tmp_path / "run"), main_weights)


def test_the_capture_check_accepts_both_optimizers():
    """Both optimizers as the trainer builds them for captured steps pass torch's own capture health check
    (under :func:`capturing`); a fused AdamW without ``capturable`` fails it, so the check is really asked."""
    from hpc_train.train.loop.step import build_optimizer

    model = torch.nn.Linear(3, 2)
    lr = torch.tensor(0.01)
    for name in ("sgd", "adamw"):
        optimizer = build_optimizer(make_spec(deep_update(RECIPE, optim={"name": name})).train,
                                    list(model.parameters()), lr, captured=True)
        model(torch.ones(4, 3)).sum().backward()
        before = model.weight.detach().clone()
        with capturing():
            optimizer.step()
        assert not torch.equal(before, model.weight), name  # the step ran
    model(torch.ones(4, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="capturable is False"), capturing():
        torch.optim.AdamW(model.parameters(), lr=lr, fused=True).step()


def test_adamw_steps_are_captured_and_compute_adamw(tmp_path, monkeypatch, caplog):
    """An AdamW recipe goes through warm-up, capture (torch's health check included) and replay of both batch
    shapes without falling back or reading the host, and ends with the weights of the eager run (its plain
    AdamW; the fused kernel rounds differently, hence a tolerance)."""
    recipe = deep_update(RECIPE, optim={"name": "adamw", "lr": 0.002, "weight_decay": 5e-4})
    _trainer(make_spec(recipe), tmp_path / "eager", guard=False).fit()  # plain AdamW reads its step count on the host
    monkeypatch.setattr(graphs, "BACKEND", FakeGraphs())
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    trainer = _trainer(make_spec(recipe), tmp_path / "graphs")
    with caplog.at_level("WARNING", logger="hpc_train.train"):
        trainer.fit()
    assert trainer.runner.failed is None and sorted(trainer.runner.graphs) == ["full", "last"], trainer.runner.failed
    assert not [r for r in caplog.records if "cuda_graphs" in r.getMessage()]
    assert trainer.runner.replays == {"full": 5 * 13 - 1, "last": 5 - 1}
    captured, plain = _final_weights(tmp_path / "graphs"), _final_weights(tmp_path / "eager")
    assert _different(captured, plain)  # two kernels ...
    for key, value in plain.items():  # ... one AdamW
        assert torch.allclose(captured[key].double(), value.double(), rtol=1e-3, atol=1e-4), key


def test_mid_epoch_resume_on_the_formulation_equals_the_uninterrupted_run(tmp_path, main_weights, monkeypatch,
                                                                          restore_signals):
    monkeypatch.setattr(graphs, "BACKEND", FakeGraphs())
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    spec = make_spec({**RECIPE, "preempt_check_every_steps": 1})
    trainer = _trainer(spec, tmp_path / "run")
    stop_at = 3 * STEPS + 6  # epoch 4 (after the DRW switch and a milestone), mid-epoch, graphs replaying
    after_step = trainer._after_step

    def signal_at():
        if trainer.global_step == stop_at - 1:
            preempt._handler(signal.SIGUSR2, None)
        after_step()

    trainer._after_step = signal_at
    with pytest.raises(preempt.Preempted) as stopped:
        trainer.fit()
    assert stopped.value.exit_code == preempt.EXIT_CHECKPOINTED
    state = ckpt.load_latest(tmp_path / "run")[0]
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (3, 6, stop_at)
    assert rundir.read_state(tmp_path / "run").state == "preempted"
    preempt.reset()
    resumed = _trainer(spec, tmp_path / "run")
    assert (resumed.epoch, resumed.step_in_epoch) == (3, 6)
    resumed.fit()
    assert resumed.global_step == 5 * STEPS
    assert not _different(_final_weights(tmp_path / "run"), main_weights)


@pytest.mark.parametrize("method", [{"sam_rho": 0.5}, {"sam_rho": 0.1, "sam_tail_below": 20}, {"mixup": 1.0}],
                         ids=["sam", "imbsam", "mixup"])
def test_sam_imbsam_and_mixup_steps_are_captured_like_the_plain_one(tmp_path, monkeypatch, method):
    # The sharpness-aware step (two forward-backward passes, one optimizer step) and mixup read nothing back to
    # the host (every step under the guard), and the replayed captured step gives the eager weights bit for bit.
    optim = {**RECIPE["optim"], **{k: v for k, v in method.items() if k.startswith("sam")}}
    spec = make_spec(deep_update(RECIPE, epochs=2, optim=optim, mixup_alpha=method.get("mixup", 0.0),
                                 loss={"name": "ldam", "drw_epoch": 1}, schedule={"milestones": [1]}))
    _trainer(spec, tmp_path / "eager").fit()
    fake = FakeGraphs()
    monkeypatch.setattr(graphs, "BACKEND", fake)
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    trainer = _trainer(spec, tmp_path / "graphs")
    trainer.fit()
    assert (trainer.step.sam is not None) == ("sam_rho" in method) and trainer.runner.replays["full"] == 2 * 13 - 1
    assert not _different(_final_weights(tmp_path / "graphs"), _final_weights(tmp_path / "eager"))


class _Reads(NoHostSync):
    """NoHostSync that also records the storages a step reads without having made them itself."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()
        self.read: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        self.read |= {a.untyped_storage().data_ptr() for a in flat if isinstance(a, torch.Tensor)} - self.made
        self.made |= {o.untyped_storage().data_ptr() for o in torch.utils._pytree.tree_leaves(out)
                      if isinstance(o, torch.Tensor)}
        return out


def test_phase_changes_update_what_a_captured_step_reads_in_place(tmp_path, monkeypatch):
    spec = make_spec(deep_update(RECIPE, epochs=4, schedule={"name": "multistep", "warmup_epochs": 1,
                                                             "milestones": [2, 3], "gamma": 0.1},
                                 two_stage={"crt_epochs": 1}))
    trainer = _trainer(spec, tmp_path / "run", guard=False)
    weights = trainer.criterion.per_class("class_weights", torch.float32)  # the copy the float32 step reads
    assert weights.dtype == torch.float32 and weights is trainer.criterion.per_class("class_weights", torch.float32)
    reads, values = {}, {}
    for epoch in (2, 3):  # the DRW switch is at epoch 3
        trainer.step.criterion.set_epoch(epoch)
        values[epoch] = weights.clone()
        trainer.step.plan = trainer.plan = trainer.feed.epoch_plan(trainer.sampler, epoch, 32, out=trainer.plan)
        trainer.rates.set_epoch([0.01] * STEPS, 0)
        trainer.state.start_at(0)
        trainer.step.body("full")  # a warm-up step (the first one makes the momentum buffers)
        recorder = reads[epoch] = _Reads()
        trainer.step.guard = lambda: recorder
        trainer.step.body("full")
        trainer.step.guard = NoHostSync
        assert weights.untyped_storage().data_ptr() in recorder.read
    assert reads[2].read == reads[3].read  # the same addresses: a graph captured in epoch 2 reads the new weights
    assert torch.equal(values[2], torch.ones_like(weights))
    assert torch.equal(values[3], trainer.criterion.cb_weights.float())
    # cRT replaces the classifier and the optimizer: new graphs, over the new parameters.
    monkeypatch.setattr(graphs, "BACKEND", FakeGraphs())
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    trainer = _trainer(spec, tmp_path / "crt")
    trainer.fit()
    # cRT's class-aware epoch is 13 full batches: a new runner warms up, captures, replays 12 of them.
    assert trainer.phase == "crt" and sorted(trainer.runner.graphs) == ["full"]
    assert trainer.runner.replays == {"full": 13 - 1}
    classifier = set(map(id, trainer.model.classifier.parameters()))
    assert {id(p) for g in trainer.optimizer.param_groups for p in g["params"]} == classifier


def test_the_guard_rejects_host_reads(tmp_path, monkeypatch):
    x = torch.arange(6.0)
    for read in (lambda: x.sum().item(), lambda: x[x > 2], lambda: bool(x.sum()), lambda: torch.nonzero(x),
                 lambda: torch.empty(3, device="meta").to("cpu"), lambda: torch.unique(x)):
        with pytest.raises(HostSyncError), NoHostSync():
            read()
    with NoHostSync():  # what the step does is allowed
        torch.where(x > 2, x, -x).index_select(0, torch.tensor([1])).add_(1)
    # A step that reads its loss back (as the progress line once did) fails under the guard.
    trainer = _trainer(make_spec(RECIPE), tmp_path / "run")
    trainer.step.plan = trainer.plan = trainer.feed.epoch_plan(trainer.sampler, 0, 32)
    trainer.rates.set_epoch([0.01] * STEPS, 0)
    trainer.state.start_at(0)
    forward = trainer.step.criterion.forward
    monkeypatch.setattr(trainer.step.criterion, "forward", lambda *a: forward(*a) * (1.0 + 0.0 * forward(*a).item()))
    with pytest.raises(HostSyncError, match="_local_scalar_dense"):
        trainer.step.body("full")


@pytest.mark.parametrize("log_every, where", [
    (1000, r"epoch 1 \(its end\)"),             # no progress line in the epoch: read at its end
    (1, r"epoch 1 step \d+ \(global step \d+\)"),  # read with a progress line, acted on at the next check
])
def test_a_non_finite_loss_stops_the_run_with_a_clear_message(tmp_path, log_every, where):
    spec = make_spec(deep_update(RECIPE, optim={"lr": 1e30, "weight_decay": 5e-4}, epochs=2, log_every_steps=log_every,
                                 preempt_check_every_steps=1,
                                 schedule={"name": "constant", "warmup_epochs": 0, "milestones": []},
                                 loss={"name": "ldam", "drw_epoch": 1}))
    trainer = _trainer(spec, tmp_path / "run")
    from hpc_train.train.observe.progress import NonFiniteLoss

    with pytest.raises(NonFiniteLoss, match=rf"not finite \(nan or inf\), first seen at {where}") as err:
        trainer.fit()
    assert err.value.exit_code == 1 and "Lower train.optim.lr" in str(err.value)
    if log_every == 1000:
        assert (trainer.epoch, trainer.step_in_epoch) == (1, 0)  # at the end of the first epoch
    else:
        assert trainer.epoch == 0 and 0 < trainer.step_in_epoch < STEPS  # mid-epoch, read on the way
    assert rundir.read_state(tmp_path / "run").state == "failed"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before evaluating or saving the epoch


def test_time_based_checkpoints_are_written_in_the_background_mid_epoch(tmp_path):
    spec = make_spec(deep_update(RECIPE, epochs=2, checkpoint_every_s=0.05, checkpoint_every_epochs=1000,
                                 preempt_check_every_steps=5, loss={"name": "ldam", "drw_epoch": 1},
                                 schedule={"name": "constant", "warmup_epochs": 0, "milestones": []}))
    trainer = _trainer(spec, tmp_path / "run")
    snapshots: dict[int, dict] = {}
    save = trainer.checkpointer.save

    def slow_save(global_step, *, wait):
        snapshots[global_step] = {k: v.clone() for k, v in trainer.state_dict()["model"].items()}
        time.sleep(0.06)  # the next check finds the interval elapsed again
        return save(global_step, wait=wait)

    trainer.checkpointer.save = slow_save
    trainer.fit()
    steps = sorted(int(p.name[5:15]) for p in ckpt.list_checkpoints(tmp_path / "run"))
    mid_epoch = [s for s in steps if s % STEPS]
    assert len(mid_epoch) >= 2 and all(s % 5 == 0 for s in mid_epoch), steps  # at the agreement points
    assert 2 * STEPS in steps  # and always at the end
    for step in steps:  # each file holds the weights of its step, not later ones (training went on meanwhile)
        saved = torch.load(ckpt.checkpoint_path(tmp_path / "run", step), weights_only=True)
        assert saved["global_step"] == step and not _different(saved["model"], snapshots[step])


CAPTURE_PLUGIN = '''
from torch import nn


class Backbone(nn.Module):
    def __init__(self, in_channels, width, host_read):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim, self.host_read = width, host_read

    def forward(self, x):
        features = self.body(x)
        if self.host_read and features.abs().sum().item() < 0:  # a value read on the host: never true
            features = -features
        return features


def build(num_classes, in_channels, host_read=False):
    return Backbone(in_channels, 8, host_read)
'''


@pytest.mark.parametrize("host_read", [False, True])
def test_plugin_steps_are_captured_only_when_their_capture_check_passes(tmp_path, monkeypatch, caplog, host_read):
    (tmp_path / "capplug.py").write_text(CAPTURE_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = deep_update(RECIPE, epochs=2, loss={"name": "ce", "drw_epoch": None},
                         model={"name": "capplug:build", "args": {"host_read": host_read}, "classifier": "linear"})
    eager = _trainer(make_spec(recipe), tmp_path / "eager", guard=False)
    eager.fit()
    fake = FakeGraphs()
    monkeypatch.setattr(graphs, "BACKEND", fake)
    monkeypatch.setattr(graphs, "decide", lambda *a, **k: (True, "cuda_graphs: test"))
    trainer = _trainer(make_spec(recipe), tmp_path / "graphs", guard=False)
    assert trainer.runner.check == "model capplug:build"
    with caplog.at_level("WARNING", logger="hpc_train.train"):
        trainer.fit()
    lines = [r.getMessage() for r in caplog.records if "not captured" in r.getMessage()]
    if host_read:  # one line naming the plug-in and the operator; every step eager, none captured
        assert len(lines) == 1 and "capplug:build" in lines[0] and "_local_scalar_dense" in lines[0], lines
        assert not fake.captures and not trainer.runner.graphs
    else:
        assert not lines and "full" in trainer.runner.graphs and trainer.runner.replays["full"] > 0
    assert not _different(_final_weights(tmp_path / "graphs"), _final_weights(tmp_path / "eager"))
