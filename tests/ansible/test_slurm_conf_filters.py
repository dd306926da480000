"""slurm_gpu_node's slurm.conf filters (filter_plugins/slurm_conf.py) against slurm.conf text as sites write it.
What real Slurm makes of these files is the real_slurm rung's: its slurmd, sbatch and slurmctld read what the
roles wrote."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent.parent.parent / "ansible" / "roles" / "slurm_gpu_node" / "filter_plugins" / "slurm_conf.py"


def load():
    sys.dont_write_bytecode = True  # ansible/ ships whole in the wheel: no __pycache__ next to the plugin
    spec = importlib.util.spec_from_file_location("slurm_conf_filters", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conf = load()
SITE = """# site slurm.conf
ClusterName=test
SlurmctldHost=slurmctl01
gresTypes = mps   # case and spaces as sites write them
PropagateResourceLimits=ALL
NodeName=cpu[01-10] CPUs=64
PartitionName=batch Nodes=ALL Default=YES
Include /etc/slurm/site-extra.conf
include hpc-train-gpu-nodes.conf
"""
NODES = "NodeName=gpu01 CPUs=96 Gres=gpu:h100:8\nNodeName=gpu-b02 NodeHostName=gpu02 CPUs=96 Gres=gpu:h100:8\n"
GOOD = "GresTypes=mps,gpu\nPropagateResourceLimitsExcept=MEMLOCK\nInclude hpc-train-gpu-nodes.conf\n"


def test_values_are_case_insensitive_last_wins_without_records() -> None:
    values = conf.slurm_conf_values(SITE + "GresTypes=gpu\n")
    assert values["grestypes"] == "gpu" and values["clustername"] == "test"
    assert "nodename" not in values and "partitionname" not in values
    assert conf.slurm_conf_values(SITE)["grestypes"] == "mps"  # the comment is not part of the value


def test_includes_in_order() -> None:
    assert conf.slurm_conf_includes(SITE) == ["/etc/slurm/site-extra.conf", "hpc-train-gpu-nodes.conf"]


@pytest.mark.parametrize("text, propagated", [
    ("", True),  # Slurm's default: PropagateResourceLimits=ALL
    ("PropagateResourceLimits=ALL", True),
    ("PropagateResourceLimits=MEMLOCK,STACK", True),
    ("PropagateResourceLimits=NONE", False),
    ("PropagateResourceLimits=CORE,STACK", False),
    ("PropagateResourceLimitsExcept=MEMLOCK", False),
    ("PropagateResourceLimitsExcept=core,memlock", False),
    ("PropagateResourceLimitsExcept=ALL", False),
    ("PropagateResourceLimitsExcept=CORE", True),
])
def test_memlock_propagation_follows_slurm(text: str, propagated: bool) -> None:
    assert conf.slurm_memlock_propagated(conf.slurm_conf_values(text)) is propagated


def test_gres_types() -> None:
    assert conf.slurm_gres_types(conf.slurm_conf_values("GresTypes=mps, gpu")) == ["mps", "gpu"]
    assert conf.slurm_gres_types({}) == []


def test_a_good_configuration_has_no_problem() -> None:
    gres = "Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    assert conf.slurm_conf_problems(GOOD, NODES, gres, "hpc-train-gpu-nodes.conf", "gpu01") == []
    configless_gres = "NodeName=gpu-b02 Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    assert conf.slurm_conf_problems(GOOD, NODES, configless_gres, "hpc-train-gpu-nodes.conf", "gpu-b02", True) == []
    # a login host: no node of its own
    assert conf.slurm_conf_problems(GOOD, NODES, "", "hpc-train-gpu-nodes.conf") == []


def test_each_problem_is_named() -> None:
    problems = conf.slurm_conf_problems(SITE.replace("include hpc-train-gpu-nodes.conf", ""), NODES, "", "hpc-train-gpu-nodes.conf", "gpu03")
    assert [p.split(" ")[0:2] for p in problems] == [["GresTypes", "is"], ["it", "propagates"], ["it", "does"],
                                                     ["the", "NodeName"], ["its", "gres.conf"]]
    assert 'GresTypes is "mps"' in problems[0] and "PropagateResourceLimitsExcept=MEMLOCK" in problems[1]


def test_included_but_missing_nodes_file_is_a_problem() -> None:
    assert conf.slurm_conf_problems(GOOD, "", "", "hpc-train-gpu-nodes.conf") == [
        "it does not include hpc-train-gpu-nodes.conf (the GPU nodes' NodeName lines)"]


def test_configless_gres_lines_must_name_the_node() -> None:
    unqualified = "Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    assert conf.slurm_conf_problems(GOOD, NODES, unqualified, "hpc-train-gpu-nodes.conf", "gpu01", True) == [
        "its gres.conf has no GPU lines for gpu01"]


@pytest.mark.parametrize("site, keys", [
    ({"propagateresourcelimits": "ALL"}, {"PropagateResourceLimitsExcept": "MEMLOCK", "PropagateResourceLimits": None}),
    ({}, {"PropagateResourceLimitsExcept": "MEMLOCK", "PropagateResourceLimits": None}),
    ({"propagateresourcelimitsexcept": "CORE"}, {"PropagateResourceLimitsExcept": "CORE,MEMLOCK", "PropagateResourceLimits": None}),
    # The site's allow-list stays an allow-list: it loses MEMLOCK (it does not become "everything but MEMLOCK").
    ({"propagateresourcelimits": "MEMLOCK,STACK"}, {"PropagateResourceLimits": "STACK"}),
    ({"propagateresourcelimits": "memlock"}, {"PropagateResourceLimits": "NONE"}),
    ({"propagateresourcelimits": "STACK"}, {}),
    ({"propagateresourcelimitsexcept": "MEMLOCK"}, {}),
])
def test_memlock_keys_keep_the_sites_choice(site: dict, keys: dict) -> None:
    assert conf.slurm_memlock_keys(site) == keys
    after = {k.lower(): v for k, v in {**site, **keys}.items() if v is not None}
    assert not conf.slurm_memlock_propagated(after)


def test_nodenames_expand_slurm_host_lists() -> None:
    text = "NodeName=DEFAULT CPUs=8\nNodeName=gpu[01-03,07],login1 CPUs=64\n# NodeName=gpu99\nnodename=cpu-a[8-10] CPUs=4\n"
    assert conf.slurm_conf_nodenames(text) == ["gpu01", "gpu02", "gpu03", "gpu07", "login1", "cpu-a8", "cpu-a9", "cpu-a10"]


def test_a_gpu_node_slurm_conf_defines_itself_is_a_problem() -> None:
    """Slurm ignores duplicate node records: the site's own line for gpu02 (no Gres) would win over the role's."""
    site = GOOD + "NodeName=gpu[01-04] CPUs=96\n"
    problems = conf.slurm_conf_problems(site, NODES, "Name=gpu Type=h100 File=/dev/nvidia[0-7]\n", "hpc-train-gpu-nodes.conf",
                                        "gpu01")
    assert problems == ["slurm.conf itself defines NodeName=gpu01, and Slurm ignores a later line for the same node, so the line "
                        "of hpc-train-gpu-nodes.conf (its GPUs) is not used: remove gpu01 from slurm.conf's NodeName lines"]


def test_gres_site_lines_keep_the_sites_lines_and_replace_only_this_nodes_gpu_lines() -> None:
    """Classic gres.conf (issue 29): the role owns only this node's GPU lines. A site's other GRES, lines for other
    nodes and comments stay; GPU lines slurmd would apply to this node (none or this NodeName) go, or slurmd would
    count the GPUs twice; the roles' own earlier file (whole, with its header) and block are theirs to replace."""
    text = "\n".join([
        "# Ansible managed", "# GPUs of this node for Slurm; the controller's NodeName line says Gres=gpu:h100:8.",
        "# site comment", "NodeName=cpu[01-02] Name=bandwidth Type=lustre Count=4G", "Name=mps Count=400",
        "Name=gpu Type=h100 File=/dev/nvidia[0-3]", "NodeName=gpu[01-04] Name=gpu File=/dev/nvidia0", "NodeName=gpu09 Name=gpu File=/dev/nvidia0",
        "AutoDetect=nvml", "NodeName=gpu09 AutoDetect=off",
        "# BEGIN hpc-train GPUs of this node", "Name=gpu Type=h100 File=/dev/nvidia[4-7]", "# END hpc-train GPUs of this node", ""])
    split = conf.slurm_gres_site_lines(text, "gpu02")
    assert split["kept"] == ["# site comment", "NodeName=cpu[01-02] Name=bandwidth Type=lustre Count=4G", "Name=mps Count=400",
                             "NodeName=gpu09 Name=gpu File=/dev/nvidia0", "NodeName=gpu09 AutoDetect=off"]
    assert split["replaced"] == ["Name=gpu Type=h100 File=/dev/nvidia[0-3]", "NodeName=gpu[01-04] Name=gpu File=/dev/nvidia0",
                                 "AutoDetect=nvml"]
    assert conf.slurm_gres_site_lines("", "gpu02") == {"kept": [], "replaced": []}


def test_gres_file_puts_the_site_lines_first_then_the_block_and_is_stable() -> None:
    block = "# Ansible managed\nName=gpu Type=h100 File=/dev/nvidia[0-3]\n"
    first = conf.slurm_gres_file("# site\nNodeName=cpu01 Name=bandwidth Count=4G\nName=gpu File=/dev/nvidia0\n", "gpu01", block)
    assert first == ("# site\nNodeName=cpu01 Name=bandwidth Count=4G\n\n# BEGIN hpc-train GPUs of this node\n# Ansible managed\n"
                     "Name=gpu Type=h100 File=/dev/nvidia[0-3]\n# END hpc-train GPUs of this node\n")
    assert conf.slurm_gres_file(first, "gpu01", block) == first  # a rerun changes nothing
    assert conf.slurm_gres_file("", "gpu01", block).startswith("# BEGIN hpc-train GPUs of this node\n")
