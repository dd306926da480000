"""Real gloo processes at world sizes 1, 2 and 3: sampler shards and exact evaluation."""

from __future__ import annotations

import subprocess
from collections import Counter

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
            procs.append(subprocess.Popen([PYTHON, "-m", "tests.train.dist_worker", str(out)], cwd=REPO, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, output[-3000:]
    return {w: torch.load(out / f"world{w}.pt", weights_only=False) for w in WORLD_SIZES}


def test_evaluation_is_identical_at_world_sizes_1_2_3(results):
    # The expectation, computed here in one process without the trainer: the same data and model,
    # the whole test split in one forward pass, per-class counts with numpy.
    from hpc_train.train import datasets
    from hpc_train.train.engine import init_model
    from hpc_train.train.pipeline import DeviceImages

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


def test_sampler_shards_are_disjoint_and_cover_the_single_process_sequence(results):
    single = results[1]
    labels = np.asarray(single["train_labels"])
    tails = {}
    for world, r in results.items():
        ranks = sorted(r["ranks"], key=lambda x: x["rank"])
        assert len(ranks) == world
        for name in dist_worker.SAMPLERS:
            for epoch in dist_worker.EPOCHS:
                sequence = single["ranks"][0]["shards"][(name, epoch)][0]  # world size 1: the whole sequence
                shards = [x["shards"][(name, epoch)][0] for x in ranks]
                steps = {x["shards"][(name, epoch)][1] for x in ranks}
                assert len(steps) == 1, (name, epoch, world)  # the same number of steps on every rank
                assert len({len(s) for s in shards}) == 1  # equal lengths
                # Disjoint: positions of the global sequence are dealt out rank by rank.
                usable = len(sequence) - len(sequence) % world
                interleaved = [shards[i % world][i // world] for i in range(usable)]
                assert interleaved == sequence[:usable], (name, epoch, world)
                cut = sequence[usable:]
                assert len(cut) < world
                # Union + the cut tail has exactly the single-process class histogram.
                union = Counter(labels[np.concatenate(shards)].tolist()) + Counter(labels[cut].tolist())
                assert union == Counter(labels[sequence].tolist())
                if name == "instance":
                    flat = np.concatenate(shards)
                    assert len(set(flat.tolist())) == len(flat)  # no image twice in an instance epoch
                tails[(name, epoch, world)] = cut
    n = len(labels)
    assert n % 2 == 1 and n % 3 != 0  # so the cut tail is not empty at world sizes 2 and 3
    for world in (2, 3):
        assert len({tuple(tails[("instance", e, world)]) for e in dist_worker.EPOCHS}) > 1  # it moves
