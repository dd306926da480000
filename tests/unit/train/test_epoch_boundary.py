"""The lean epoch boundary (issue 21), on the CPU: the host waits for nothing the GPU would still be doing.

* An epoch's evaluation runs in the background on a snapshot of that epoch's weights and is recorded when the
  next epoch ends. A deferring stand-in for the GPU's second stream (``overlap.Deferred``: the work runs only
  when its result is read, after the next epoch trained) gives exactly the records of evaluating at once, each
  under its own epoch, written one epoch late; the best held-out snapshot holds the weights of the epoch it was
  chosen at. (What the stand-in cannot show: the CUDA stream, the pinned copy and the event themselves —
  ``tests/unit/train/gpu_check.py`` on a GPU.)
* Progress is read one epoch behind: at an epoch's end the host waits for what earlier epochs recorded, not for
  this epoch's steps.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from hpc_train.train.observe import overlap, progress as progress_lines  # noqa: E402
from hpc_train.train.state import checkpoint as ckpt  # noqa: E402

from .helpers import deep_update, make_spec  # noqa: E402
from .test_captured_step import RECIPE, _different, _trainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_intraop_thread")  # tests/conftest.py says why

HELD_OUT = deep_update(RECIPE, epochs=4, eval_every_epochs=1, checkpoint_every_epochs=100,
                       data={"name": "digits-lt", "imbalance_factor": 20, "val_fraction": 0.2},
                       loss={"name": "ldam", "drw_epoch": 2}, schedule={"milestones": [2, 3]})


def _records(run_dir) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_epochs_evaluation_is_read_an_epoch_late_and_evaluates_that_epoch(tmp_path):
    spec = make_spec(HELD_OUT)
    at_once = _trainer(spec, tmp_path / "at-once")
    at_once.fit()
    trainer = _trainer(spec, tmp_path / "deferred")
    trainer.evaluator.background = deferred = overlap.Deferred(trainer.device)
    weights, written_at, snapshots = {}, {}, []
    end_epoch, finish, save = trainer.boundary.end_epoch, trainer.evaluator.finish, trainer.best_held_out.save

    def keep_weights(at):
        weights[at.epoch] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        end_epoch(at)

    def note_when(pending):
        written_at[pending.meta["epoch"]] = trainer.global_step
        return finish(pending)

    def note_snapshot(record, model):
        snapshots.append((record["epoch"], {k: v.clone() for k, v in model.state_dict().items()}))
        save(record, model)

    trainer.boundary.end_epoch, trainer.evaluator.finish, trainer.best_held_out.save = (keep_weights, note_when,
                                                                                        note_snapshot)
    trainer.fit()
    records = _records(tmp_path / "deferred")
    assert deferred.submitted == 4 and [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert records == _records(tmp_path / "at-once")  # the weights of each record's own epoch
    steps = trainer.steps_per_epoch
    # Read when the next epoch has trained (the last one by the checkpoint that ends the run)
    assert written_at == {1: 2 * steps, 2: 3 * steps, 3: 4 * steps, 4: 4 * steps}
    # Each best held-out snapshot holds the weights of the epoch it was chosen at, not of the epoch it was read in
    assert len(snapshots) >= 2 and snapshots[0][0] < 4, [e for e, _ in snapshots]
    assert all(not _different(model, weights[epoch]) for epoch, model in snapshots)
    best = ckpt.load_best_held_out(tmp_path / "deferred")
    assert best["record"]["epoch"] == trainer.best["epoch"] == snapshots[-1][0]
    assert not _different(best["model"], weights[best["record"]["epoch"]])
    # Not vacuous: the epochs' weights differ, so a later epoch's would have shown.
    assert all(_different(weights[e], weights[e + 1]) for e in (1, 2, 3))


class _Event:
    def __init__(self) -> None:
        self.done = self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True


def test_progress_is_read_one_epoch_behind():
    progress = progress_lines.Progress(torch.device("cpu"), printing=False)

    def recorded(loss: float, marker: float) -> _Event:
        event = _Event()
        progress._pending.append(progress_lines._Pending(torch.tensor([loss, marker]), event, None, "somewhere",
                                                 progress._epoch))
        return event

    progress.begin_epoch()
    earlier = recorded(1.0, 0.0)
    progress.begin_epoch()
    this_epoch = recorded(2.0, float("nan"))  # a non-finite loss in this epoch: still in flight
    progress.flush(wait=True, behind=True)
    assert earlier.waited and not this_epoch.waited and progress.nonfinite_at is None
    progress.flush(wait=True)  # a checkpoint: everything
    assert this_epoch.waited and progress.nonfinite_at == "somewhere"



def test_the_snapshot_an_evaluation_reads_is_the_live_model_in_both_stages(tmp_path):
    # Stage 2 re-creates the classifier with the same shapes (crt_reinit): a snapshot that kept copying from the
    # old tensors would evaluate stage 1's classifier for all of stage 2.
    spec = make_spec(deep_update(HELD_OUT, two_stage={"crt_epochs": 2, "crt_reinit": True}))
    trainer = _trainer(spec, tmp_path / "run")
    begin, checked = trainer.evaluator.begin, []

    def begin_and_compare(**kwargs):
        pending = begin(**kwargs)
        live = trainer.model.state_dict()
        checked.append((kwargs["phase"], not _different(pending.model.state_dict(), live)))
        return pending

    trainer.evaluator.begin = begin_and_compare
    trainer.fit()
    assert [phase for phase, _ in checked] == ["main"] * 4 + ["crt"] * 2
    assert all(same for _, same in checked), checked
