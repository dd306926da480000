"""Evaluation on the device: the split normalised once, per-class counts accumulated on the device, no
host read inside (the dispatcher guard watches), and the batch size changes nothing: the 10,000-image
test split in one batch gives exactly the counts of batches of 500. (World sizes 1, 2 and 3:
test_distributed.py.) Also the CUDA-graph decision, which depends on the configuration only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpc_train.rank.dist import DistEnv  # noqa: E402
from hpc_train.train.data import datasets
from hpc_train.train.loop import graphs  # noqa: E402
from hpc_train.train.loop.context import RankContext  # noqa: E402
from hpc_train.train.loop.engine import Trainer  # noqa: E402
from hpc_train.train.loop.guard import NoHostSync  # noqa: E402

from .helpers import deep_update, make_spec  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_intraop_thread")  # tests/conftest.py says why


SYNTHETIC = {"epochs": 1, "batch_size": 64, "log_every_steps": 1000,
             "data": {"name": "synthetic-lt", "num_classes": 10, "max_per_class": 20, "imbalance_factor": 10,
                      "test_per_class": 1000, "image_size": 8},
             "model": {"name": "small_cnn"}}


def test_one_batch_of_10000_equals_batches_of_500(tmp_path):
    counts = {}
    for batch in (10_000, 500):
        spec = make_spec({**SYNTHETIC, "eval_batch_size": batch})
        data = datasets.load(spec.train.data)
        ctx = RankContext(env=DistEnv.from_environ(), device=torch.device("cpu"), rank=0, world_size=1,
                          distributed=False)
        trainer = Trainer(spec, ctx, data, tmp_path / str(batch))
        with torch.no_grad():  # a classifier with spread-out predictions, so every class's count matters
            gen = torch.Generator().manual_seed(3)
            trainer.model.classifier.weight.copy_(torch.randn(trainer.model.classifier.weight.shape, generator=gen))
        with NoHostSync(where="evaluation"):
            counts[batch] = trainer.evaluate("test", trainer.heads())["plain"]
        assert trainer.evaluator.images == 10_000
    correct, count = counts[10_000]
    assert count == [1000] * 10 and 0 < sum(correct) < 10_000 and len(set(correct)) > 3, correct
    assert counts[500] == counts[10_000]


@pytest.mark.parametrize("change, on, why", [
    ({}, True, "one graph per batch shape"),
    ({"cuda_graphs": False}, False, "cuda_graphs: off"),
    ({"amp": "fp16"}, False, "gradient scaler"),
    ({"strategy": "dp"}, False, "strategy dp"),
])
def test_the_graph_decision(change, on, why):
    t = make_spec(deep_update({"batch_size": 32, "device": "cuda"}, **change), gpus_per_node=1).train
    got, reason = graphs.decide(t, torch.device("cuda", 0), world_size=1, in_memory=True)
    assert (got, why in reason) == (on, True), reason
    assert graphs.decide(t, torch.device("cpu"), world_size=1, in_memory=True)[0] is False
    if on:
        off, reason = graphs.decide(t, torch.device("cuda", 0), world_size=4, in_memory=True)
        assert not off and "world size 4" in reason and "unverified" in reason
        assert not graphs.decide(t, torch.device("cuda", 0), world_size=1, in_memory=False)[0]
