"""Sampler distributions and sharding arithmetic (in one process), and the many/medium/few rules.

The cross-process properties (disjoint shards, union = single-process sequence, identical evaluation
at world sizes 1, 2, 3) are checked with real gloo processes in test_distributed.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hpc_train.train.data.datasets import longtail_counts  # noqa: E402
from hpc_train.train.data.samplers import GlobalSampler  # noqa: E402
from hpc_train.train.observe.metrics import format_table, group_sizes, shot_group, summarize  # noqa: E402

from .helpers import ldam_counts  # noqa: E402

COUNTS = [400, 120, 40, 10]
LABELS = np.repeat(np.arange(4), COUNTS)


def _class_histogram(sampler: GlobalSampler, epoch: int) -> np.ndarray:
    seq = sampler.global_sequence(epoch).numpy()
    return np.bincount(LABELS[seq], minlength=4) / len(seq)


def test_instance_sampler_is_a_permutation_that_changes_per_epoch():
    s = GlobalSampler(LABELS, 4, name="instance", seed=3)
    e0, e1 = s.global_sequence(0), s.global_sequence(1)
    assert sorted(e0.tolist()) == list(range(len(LABELS)))
    assert not torch.equal(e0, e1)
    assert torch.equal(e0, GlobalSampler(LABELS, 4, name="instance", seed=3).global_sequence(0))  # (seed, epoch)
    assert not torch.equal(e0, GlobalSampler(LABELS, 4, name="instance", seed=4).global_sequence(0))


@pytest.mark.parametrize("name, expected", [
    ("class_balanced", [0.25] * 4),
    ("sqrt", [math.sqrt(n) / sum(math.sqrt(m) for m in COUNTS) for n in COUNTS]),
])
def test_rebalancing_samplers_hit_their_class_distribution(name, expected):
    s = GlobalSampler(LABELS, 4, name=name, seed=0, num_samples=200_000)
    hist = _class_histogram(s, 0)
    assert hist.tolist() == pytest.approx(expected, abs=0.005)  # 200k draws: sd < 0.001
    # Within a class every image is drawn about equally often (class 3 has 10 images).
    seq = s.global_sequence(0).numpy()
    tail = np.bincount(seq[LABELS[seq] == 3] - 560, minlength=10)
    assert tail.min() > 0.8 * tail.mean()


def _classifier_balancing_progressive(counts, epochs: int, epoch: int) -> list[float]:
    """Class probabilities of epoch ``epoch`` (from 0) of facebookresearch/classifier-balancing's progressively
    balanced sampler, transcribed from ``data/MixedPrioritizedSampler.py`` (HEAD f162ade, ``manual_only``,
    ``lam: null``, ``cycle: 0``): λ = ``np.linspace(0, 1, epochs)`` (l.232), indexed by ``reset_weights(epoch)``
    with the epoch clipped to [0, epochs - 1] (l.323-332), which ``run_networks.py`` calls at the end of its
    1-based epoch k (l.247, l.336-337) for the next one, the first epoch using ``lams[0]`` (l.263); per-image
    weights ``balanced * λ + (1 - λ)`` (l.279-287) with ``balanced`` = min(n)/n_c rescaled to sum to N (l.289-312)."""
    cnts = np.asarray(counts, dtype=float)
    lams = np.linspace(0, 1, epochs)
    lam = lams[min(max(epoch, 0), epochs - 1)]  # 0-based epoch t trains after reset_weights(t) (1-based epoch t)
    per_image_balanced = (cnts.min() / cnts) * (cnts.sum() / (cnts * (cnts.min() / cnts)).sum())
    per_image = per_image_balanced * lam + (1 - lam)
    mass = cnts * per_image
    return (mass / mass.sum()).tolist()


def test_progressive_sampler_is_classifier_balancings_linspace_schedule():
    s = GlobalSampler(LABELS, 4, name="progressive", seed=0, progressive_epochs=10, num_samples=200_000)
    for epoch in range(12):
        assert s.class_probabilities(epoch).tolist() == pytest.approx(
            _classifier_balancing_progressive(COUNTS, 10, epoch), abs=1e-12), epoch
    instance = [n / sum(COUNTS) for n in COUNTS]
    assert _class_histogram(s, 0).tolist() == pytest.approx(instance, abs=0.005)
    # λ = t/(T-1): the last epoch of the schedule (t = 9 of 10) samples class-balanced, which t/T never reached.
    assert _class_histogram(s, 9).tolist() == pytest.approx([0.25] * 4, abs=0.005)
    third = [2 / 3 * p + 1 / 3 * 0.25 for p in instance]
    assert _class_histogram(s, 3).tolist() == pytest.approx(third, abs=0.005)
    one = GlobalSampler(LABELS, 4, name="progressive", seed=0, progressive_epochs=1)
    assert one.class_probabilities(5).tolist() == pytest.approx(instance)  # linspace(0, 1, 1) == [0]


def test_progressive_sampler_in_crt_follows_the_stage_s_own_epochs():
    # cRT after 10 main epochs, 4 cRT epochs: T is cRT's length and t counts cRT's epochs (a global
    # epoch of 10 would make it class-balanced from the start).
    from hpc_train.train.data.samplers import stage_sampler

    from .helpers import make_spec

    spec = make_spec({"epochs": 10, "batch_size": 64, "two_stage": {"crt_epochs": 4, "crt_sampler": "progressive"}})
    labels = np.repeat(LABELS, 350)  # 199,500 draws per epoch
    s = stage_sampler(spec.train, labels, 4, "crt")
    instance = [n / sum(COUNTS) for n in COUNTS]
    hist = lambda e: (np.bincount(labels[s.global_sequence(e).numpy()], minlength=4)  # noqa: E731
                      / s.num_samples).tolist()
    assert hist(10) == pytest.approx(instance, abs=0.005)  # cRT's first epoch: t = 0
    assert hist(11) == pytest.approx([2 / 3 * p + 1 / 3 * 0.25 for p in instance], abs=0.005)
    assert hist(13) == pytest.approx([0.25] * 4, abs=0.005)  # cRT's last epoch: balanced
    main = stage_sampler(spec.train, labels, 4, "main")
    assert not torch.equal(main.global_sequence(10), s.global_sequence(10))  # stages are seeded apart


def test_class_aware_sampler_cycles_classes_and_images():
    # classifier-balancing's ClassAwareSampler: classes in shuffled cycles, k images per class per draw,
    # each class's images in shuffled cycles; int(N / batch) whole batches per epoch.
    s = GlobalSampler(LABELS, 4, name="class_aware", seed=0, per_class_draw=4, batch_size=64)
    assert s.num_samples == (570 // 64) * 64 == 512 and s.steps_per_epoch(64) == 8
    seq = s.global_sequence(0).numpy()
    classes = LABELS[seq].reshape(-1, 4)
    assert (classes == classes[:, :1]).all()  # 4 images of one class per draw
    order = classes[:, 0]
    for cycle in range(len(order) // 4):
        assert sorted(order[4 * cycle:4 * cycle + 4].tolist()) == [0, 1, 2, 3]  # every class once per cycle
    tail = seq[LABELS[seq] == 3] - 560  # class 3 has 10 images: consecutive cycles through all of them
    assert all(sorted(tail[10 * c:10 * c + 10].tolist()) == list(range(10)) for c in range(len(tail) // 10))
    assert np.bincount(order, minlength=4).tolist() == [32] * 4  # balanced
    assert not np.array_equal(seq, s.global_sequence(1).numpy())


def test_global_batches_and_rank_shares():
    s = GlobalSampler(LABELS, 4, name="instance", seed=0)  # 570 images: 35 batches of 16 and one of 10
    sequence = s.global_sequence(0)
    for world in (1, 2, 3, 4, 7, 16):
        steps = [list(s.batches(0, r, world, 16)) for r in range(world)]
        assert {len(b) for b in steps} == {math.ceil(570 / 16)} == {s.steps_per_epoch(16)}  # any world size
        for i in range(len(steps[0])):
            whole = sequence[16 * i:16 * (i + 1)]
            assert all(torch.equal(steps[r][i][1], whole) for r in range(world))  # every rank knows the global batch
            shares = [steps[r][i][0] for r in range(world)]
            assert torch.equal(torch.cat(shares).sort().values, whole.sort().values)  # dealt out, nothing cut
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert len(steps[world - 1][-1][0]) == len(range(world - 1, 10, world))  # the short last batch
    assert len(steps[15][-1][0]) == 0  # 16 ranks, 10 images: the last 6 ranks hold none (and still step)
    resumed = list(s.batches(2, 1, 3, 16, start_step=5))
    full = list(s.batches(2, 1, 3, 16))
    assert len(resumed) == len(full) - 5
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, full[5:]))


def test_sampler_state_round_trip():
    s = GlobalSampler(LABELS, 4, name="sqrt", seed=1)
    for _ in zip(range(3), s.batches(4, 0, 2, 8)):
        pass
    state = s.state_dict()
    other = GlobalSampler(LABELS, 4, name="sqrt", seed=1)
    other.load_state_dict(state)
    assert (other.epoch, other.step) == (4, 2)  # the third batch was in flight
    with pytest.raises(ValueError):
        GlobalSampler(LABELS, 4, name="sqrt", seed=2).load_state_dict(state)


def test_group_boundaries_are_pinned_at_exactly_100_and_20():
    assert [shot_group(n) for n in (101, 100, 99, 21, 20, 19, 1)] == [
        "many", "medium", "medium", "medium", "medium", "few", "few"]


def test_group_sizes_on_cifar100_lt_match_the_literature():
    # The LDAM-DRW profile puts exactly 20 images in class 69 at IF 100, exactly 20 in class 81 at IF 50
    # and exactly 100 in class 69 at IF 10: the boundary convention decides these (notes, §1.3).
    assert group_sizes(ldam_counts(500, 100, 100)) == {"many": 35, "medium": 35, "few": 30}
    assert group_sizes(ldam_counts(500, 100, 50)) == {"many": 41, "medium": 41, "few": 18}
    assert group_sizes(ldam_counts(500, 100, 10)) == {"many": 69, "medium": 31, "few": 0}
    assert ldam_counts(500, 100, 100)[69] == 20 and ldam_counts(500, 100, 10)[69] == 100
    assert longtail_counts(500, 100, 100) == ldam_counts(500, 100, 100)


def test_summarize_by_hand():
    train_counts = [150, 100, 20, 19]     # many, medium, medium, few
    correct, count = [9, 6, 1, 0], [10, 10, 4, 0]  # the few class has no test images
    s = summarize(correct, count, train_counts)
    assert s["top1"] == pytest.approx(16 / 24)
    assert s["per_class"] == [pytest.approx(0.9), pytest.approx(0.6), pytest.approx(0.25), None]
    assert s["balanced"] == pytest.approx((0.9 + 0.6 + 0.25) / 3)
    assert s["many"] == pytest.approx(0.9)
    assert s["medium"] == pytest.approx((0.6 + 0.25) / 2)
    assert s["few"] is None
    table = format_table({"last": s}, train_counts)
    assert "66.67" in table and "90.00" in table and "42.50" in table
