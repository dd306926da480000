"""runs/bad_nodes.py: the run's bad-node list in its run directory — added to once per node, never so far that the
job's pool could not hold it, and read back whatever the file holds."""

from __future__ import annotations

import json

from hpc_train.runs import bad_nodes


def test_a_node_is_listed_once_with_why_and_which_attempt(tmp_path):
    assert bad_nodes.excluded_names(tmp_path) == []  # no file: no list
    assert bad_nodes.add(tmp_path, "gpu02", "hung", job_id="77", restart=1) == (
        True, "excluded node gpu02 from this job's next attempts (hung)")
    assert bad_nodes.add(tmp_path, "gpu02", "hung again", job_id="77", restart=2) == (True, "")  # already listed
    (entry,) = bad_nodes.excluded(tmp_path)
    assert {k: entry[k] for k in ("node", "reason", "job_id", "restart")} == {
        "node": "gpu02", "reason": "hung", "job_id": "77", "restart": 1}
    bad_nodes.add(tmp_path, "gpu05", "NODE_FAIL of attempt 1", job_id="77", restart=2)
    assert bad_nodes.excluded_names(tmp_path) == ["gpu02", "gpu05"]  # oldest first


def test_a_node_is_not_listed_when_too_few_would_remain_for_the_job(tmp_path):
    pool = ["gpu01", "gpu02", "gpu03"]
    assert bad_nodes.add(tmp_path, "gpu02", "hung", job_id="5", restart=0, pool=pool, needed_nodes=2)[0] is True
    listed, message = bad_nodes.add(tmp_path, "gpu01", "hung", job_id="5", restart=1, pool=pool,
                                    pool_name="partition gpu", needed_nodes=2)
    assert not listed
    assert message == "not excluding gpu01: only 1 node(s) of partition gpu would remain for a job of 2 node(s)"
    assert bad_nodes.excluded_names(tmp_path) == ["gpu02"]


def test_a_list_that_is_not_one_reads_as_empty_and_entries_without_a_node_are_skipped(tmp_path):
    path = tmp_path / bad_nodes.EXCLUDED_NODES
    path.write_text("{not json")
    assert bad_nodes.excluded(tmp_path) == []
    path.write_text(json.dumps(["gpu01"]))
    assert bad_nodes.excluded(tmp_path) == []
    path.write_text(json.dumps({"nodes": [{"reason": "no node"}, "gpu01", {"node": "gpu03", "reason": "hung"}]}))
    assert bad_nodes.excluded_names(tmp_path) == ["gpu03"]
