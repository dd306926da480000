"""Real gloo processes at world sizes 1, 2 and 3: rank shares of the global batches, exact evaluation."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from . import dist_worker  # noqa: E402
from .helpers import PYTHON, REPO, clean_env, free_port  # noqa: E402

WORLD_SIZES = (1, 2, 3)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run the worker at every world size (all six processes at once) and load what rank 0 saved."""
    out = tmp_path_factory.mktemp("dist")
    procs = []
    for world in WORLD_SIZES:
        port = str(free_port())
        for rank in range(world):
            env = clean_env(out, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                            LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            procs.append(subprocess.Popen([PYTHON, "-m", "tests.unit.train.dist_worker", str(out)], cwd=REPO, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, output[-3000:]
    return {w: torch.load(out / f"world{w}.pt", weights_only=False) for w in WORLD_SIZES}


def test_evaluation_is_identical_at_world_sizes_1_2_3(results):
    # The expectation, computed here in one process without the trainer: the same data and model,
    # the whole test split in one forward pass, per-class counts with numpy.
    from hpc_train.train.data import datasets
    from hpc_train.train.data.pipeline import DeviceImages
    from hpc_train.train.model.models import init_model

    job = dist_worker.spec(1)
    data = datasets.load(job.train.data)
    model = init_model(job.train, data)
    dist_worker.perturb(model)
    model.eval()
    images = DeviceImages(data.test, torch.device("cpu"), mean=data.mean, std=data.std, crop_padding=0, flip=False,
                          channels_last=False)
    x, y = images.plain(torch.arange(len(data.test)))
    with torch.no_grad():
        pred = model(x).argmax(1).numpy()
    labels = y.numpy()
    expected_count = np.bincount(labels, minlength=7).tolist()
    expected_correct = np.bincount(labels[pred == labels], minlength=7).tolist()
    assert expected_count == [11] * 7  # 77 images: splits unevenly over 2 and over 3 ranks
    per_class = [c / 11 for c in expected_correct]
    assert len(set(per_class)) >= 3 and 0 < sum(expected_correct) < 77, per_class  # a non-trivial model
    for world, r in results.items():
        assert r["count"] == expected_count, world  # every image exactly once: no padding, nothing dropped
        assert r["correct"] == expected_correct, world


def test_every_world_size_trains_on_the_same_global_batches(results):
    single = results[1]
    labels = np.asarray(single["train_labels"])
    n, batch = len(labels), dist_worker.SAMPLER_BATCH
    assert 0 < n % batch < 3  # the last global batch has fewer images than 3 ranks
    for world, r in results.items():
        ranks = sorted(r["ranks"], key=lambda x: x["rank"])
        assert len(ranks) == world
        for name in dist_worker.SAMPLERS:
            for epoch in dist_worker.EPOCHS:
                reference = single["ranks"][0]["shards"][(name, epoch)]  # world size 1: the global batches
                shares = [x["shards"][(name, epoch)] for x in ranks]
                assert {len(s) for s in shares} == {len(reference)}, (name, epoch, world)  # same steps everywhere
                for step, whole in enumerate(reference):
                    mine = [s[step] for s in shares]
                    # Rank k holds positions k, k + W, ... of the global batch: interleaved, they are it.
                    interleaved = [mine[i % world][i // world] for i in range(len(whole))]
                    assert interleaved == whole, (name, epoch, world, step)
                    assert sum(map(len, mine)) == len(whole)  # nothing cut, nothing repeated
                flat = [i for batch in reference for i in batch]
                if name == "instance":
                    assert sorted(flat) == list(range(n))  # every image exactly once per epoch
                elif name == "class_aware":
                    assert len(flat) == (n // batch) * batch  # whole batches only, as classifier-balancing steps
                else:
                    assert len(flat) == n
    last = [len(x["shards"][("instance", 0)][-1]) for x in sorted(results[3]["ranks"], key=lambda x: x["rank"])]
    assert last == [len(range(k, n % batch, 3)) for k in range(3)] and 0 in last  # a rank with an empty last batch
