"""Checkpoint files are read as data, and one that cannot be used stops the run with exit 2 naming it (review
of issue 19, S8): best-heldout.pt was loaded with an unguarded torch.load (a traceback in stage 2), and a
checkpoint that passed load_latest's check but lacked the trainer's keys gave a KeyError in
Trainer.load_state_dict."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpc_train.errors import HpcTrainError  # noqa: E402
from hpc_train.train.state import checkpoint as ckpt  # noqa: E402

WHOLE = {"format": ckpt.FORMAT_VERSION, "model": {}, "optimizer": {}, "phase": "main", "epoch": 1,
         "step_in_epoch": 0, "global_step": 7}


def _write(run_dir, name, state):
    ckpt.checkpoint_dir(run_dir).mkdir(parents=True, exist_ok=True)
    path = ckpt.checkpoint_dir(run_dir) / name
    if isinstance(state, bytes):
        path.write_bytes(state)
    else:
        torch.save(state, path)
    return path


def test_a_checkpoint_without_the_trainers_keys_is_passed_over_for_an_older_whole_one(tmp_path):
    _write(tmp_path, "ckpt-0000000007.pt", WHOLE)
    _write(tmp_path, "ckpt-0000000014.pt", {"format": ckpt.FORMAT_VERSION, "model": {}})
    state, path = ckpt.load_latest(tmp_path)
    assert path.name == "ckpt-0000000007.pt" and state["global_step"] == 7


def test_only_checkpoints_without_the_trainers_keys_are_refused_naming_them(tmp_path):
    _write(tmp_path, "ckpt-0000000014.pt", {"format": ckpt.FORMAT_VERSION, "model": {}, "epoch": 2})
    with pytest.raises(HpcTrainError, match=r"ckpt-0000000014.pt: ValueError: a checkpoint without optimizer, "
                                            r"phase, step_in_epoch, global_step") as refused:
        ckpt.load_latest(tmp_path)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize("content", [b"truncated by a full disk", {"format": ckpt.FORMAT_VERSION, "model": {}},
                                     {"format": ckpt.FORMAT_VERSION, "model": {}, "record": {"epoch": 3}},
                                     b"cos\nsystem\n(S'true'\ntR."],
                         ids=["truncated", "no-record", "record-without-val", "crafted"])
def test_an_unreadable_best_held_out_snapshot_is_refused_naming_it(tmp_path, content):
    path = _write(tmp_path, ckpt.BEST_HELD_OUT, content)
    with pytest.raises(HpcTrainError, match=rf"{path} cannot be read \(.*\); stage 2") as refused:
        ckpt.load_best_held_out(tmp_path)
    assert refused.value.exit_code == 2 and "weights_only=False" not in str(refused.value)
    path.unlink()
    assert ckpt.load_best_held_out(tmp_path) is None


def test_a_checkpoint_of_another_model_stops_the_restore_naming_it(tmp_path):
    # The trainer's load_state_dict starts with the model's: a checkpoint of another architecture (a job file
    # edited between runs) raised torch's RuntimeError as a traceback. The stand-in holds only a model (the
    # Stateful protocol the Checkpointer restores into); it cannot show the trainer's other keys.
    from hpc_train.train.state.checkpointer import Checkpointer

    class OneLayer:
        def __init__(self, width):
            self.model = torch.nn.Linear(width, 2)

        def state_dict(self):
            return {"model": self.model.state_dict()}

        def load_state_dict(self, state):
            self.model.load_state_dict(state["model"])

    _write(tmp_path, "ckpt-0000000007.pt", {**WHOLE, "model": OneLayer(3).model.state_dict()})
    checkpointer = Checkpointer(tmp_path, torch.device("cpu"), keep=2, writer=False, train_state=OneLayer(4))
    with pytest.raises(HpcTrainError, match=r"ckpt-0000000007.pt: the run cannot continue from it \(RuntimeError: "):
        checkpointer.restore()
    assert Checkpointer(tmp_path, torch.device("cpu"), keep=2, writer=False, train_state=OneLayer(3)).restore()
