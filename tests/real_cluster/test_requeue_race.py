"""A hang on the harness -> the watchdog's requeue -> completed, with the job never left held and the hung node in
its ExcNodeList (issue 26: the step's SIGTERM after ``requeuehold`` used to kill the ``scontrol update`` or
``release`` it raced with, about 1 run in 4, stranding the job held for good). One run here; the race itself is
counted over many runs by benchmarks/requeue_race.py (the same driver, tests/real_cluster/requeue_race.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.real_cluster.requeue_race import follow, submit

pytestmark = pytest.mark.timeout(300)


def test_a_watchdog_requeue_is_never_left_held_and_excludes_the_hung_node(slurm_cluster, tmp_path):
    env = slurm_cluster.env
    runs = [submit(env, tmp_path, f"race{i}", hang_timeout_s=10) for i in range(2)]  # two at once: two races
    with ThreadPoolExecutor(max_workers=2) as pool:  # each watched from its start: a hold is seen while it lasts
        list(pool.map(lambda run: follow(env, tmp_path, run, timeout_s=180), runs))
    for run in runs:
        facts = run.summary()
        assert not run.stranded, f"left held: {facts}"
        assert run.end == "COMPLETED" and run.restarts == 1, facts
        assert run.first_node and run.exc_node_list == run.first_node, facts
        assert len(run.nodes) == 2 and run.nodes[1] != run.first_node, facts
        assert any(f"requeued job {run.job_id}, excluding {run.first_node}" in line for line in run.watchdog_lines), facts
