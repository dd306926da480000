"""World size 2 (real gloo processes): the all-reduce a captured step replays gives DDP's gradients,
weights and BatchNorm buffers, bit for bit (two ranks: a sum of two numbers has one rounding)."""

from __future__ import annotations

import subprocess

import pytest

torch = pytest.importorskip("torch")

from .helpers import PYTHON, REPO, clean_env, free_port  # noqa: E402

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("grad_sync")
    port = str(free_port())
    procs = [subprocess.Popen([PYTHON, "-m", "tests.unit.train.grad_sync_worker", str(out)], cwd=REPO,
                              env=clean_env(out, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD),
                                            LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    for p in procs:
        output, _ = p.communicate(timeout=120)
        assert p.returncode == 0, output[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def test_the_all_reduce_formulation_gives_ddps_gradients_and_buffers(ranks):
    for rank, got in enumerate(ranks):
        for step in range(2):
            ddp, ours = got["ddp"][step], got["all_reduce"][step]
            assert _same(ours["grads"], ddp["grads"]), (rank, step)
            assert _same(ours["params"], ddp["params"]), (rank, step)
            assert _same(ours["buffers"], ddp["buffers"]), (rank, step)
    # Gradients are averaged: the same on both ranks; BatchNorm statistics are per rank (DDP broadcasts rank
    # 0's before each forward, then each rank updates them with its own images): different after a step.
    assert _same(ranks[0]["all_reduce"][1]["grads"], ranks[1]["all_reduce"][1]["grads"])
    running = [r["all_reduce"][1]["buffers"]["backbone.1.running_mean"] for r in ranks]
    assert not torch.equal(*running)
    # Not vacuous: without the broadcast, rank 1's statistics drift from DDP's at the second step.
    assert _same(ranks[1]["no_broadcast"][0]["buffers"], ranks[1]["ddp"][0]["buffers"])
    assert not _same(ranks[1]["no_broadcast"][1]["buffers"], ranks[1]["ddp"][1]["buffers"])
