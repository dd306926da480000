"""Node-list expansion against the node lists real launchers got wrong (Lightning reads rack[1-2]-n[01-02] as rack1)."""

import pytest

from hpc_train.errors import ConfigError
from hpc_train.rank.hostlist import count, expand, expand_tasks_per_node

VECTORS = [
    ("gpu[01-03,07],cpu-a[1-2]", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu-a1", "cpu-a2"]),
    ("node-[009-011]", ["node-009", "node-010", "node-011"]),
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
    ("linux[1,2]", ["linux1", "linux2"]),
    ("b04-[09-10]", ["b04-09", "b04-10"]),
    ("nodeA,nodeB[001,003],nodeC", ["nodeA", "nodeB001", "nodeB003", "nodeC"]),
    # Lightning's regex returns "rack1" here.
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("gpu01", ["gpu01"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # no padding: widths grow
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),  # padding kept, then outgrown
]


@pytest.mark.parametrize("nodelist,hosts", VECTORS)
def test_expand(nodelist, hosts):
    assert expand(nodelist) == hosts


@pytest.mark.parametrize("bad", ["", "gpu[01-03", "gpu01]", "gpu[a-b]", "gpu[5-2]", "gpu[1-2-3]"])
def test_expand_rejects_malformed(bad):
    with pytest.raises(ConfigError):
        expand(bad)


@pytest.mark.parametrize(
    "value,counts",
    [("8(x4)", [8, 8, 8, 8]), ("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,3", [1, 2, 3])],
)
def test_tasks_per_node(value, counts):
    assert expand_tasks_per_node(value) == counts


def test_tasks_per_node_rejects_garbage():
    with pytest.raises(ConfigError):
        expand_tasks_per_node("8(x)")


@pytest.mark.parametrize("nodelist,hosts", VECTORS)
def test_count_agrees_with_expand(nodelist, hosts):
    assert count(nodelist) == len(hosts)


def test_huge_node_lists_are_counted_not_expanded():
    assert count("gpu[1-99999999]") == 99_999_999
    assert count("a[1-1000]-b[1-1000],c") == 1_000_001
    with pytest.raises(ConfigError, match="names 99,999,999 hosts; at most 100"):
        expand("gpu[1-99999999]", max_hosts=100)
