"""common.sh names and addresses nodes past gpu99 and past a /24 (benchmarks/scale_cluster.py's 256 nodes): each
node a distinct address inside the bridge's network, and a stop clears a gpuNNN namespace a larger shape left. The
functions run in bash as slurm-up and slurm-down run them; only `ip netns list`'s answer is given (a namespace needs
root and would touch the machine's one cluster)."""

from __future__ import annotations

import ipaddress
import os
import subprocess

from tests.cluster import harness

COMMON = harness.HARNESS_DIR / "common.sh"


def bash(script: str, nodes: int) -> str:
    env = {**os.environ, "HPCTRAIN_SLURM_NODES": str(nodes), "HPCTRAIN_SLURM_DIR": "/nonexistent/c26"}
    env.pop("HPCTRAIN_SLURM_NET", None)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; source {COMMON}; {script}"], env=env,
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout


def addresses(nodes: int) -> tuple[ipaddress.IPv4Network, dict[str, ipaddress.IPv4Address]]:
    # (before the /22, slurm-up wrote /24 itself: hence the default)
    out = bash('echo "$CTL_IP/${NET_PREFIX:-24}"; for n in "${NODES[@]}"; do echo "$n $(ip_of "$n")"; done', nodes)
    first, *rest = out.splitlines()
    network = ipaddress.ip_interface(first).network
    return network, {name: ipaddress.ip_address(ip) for name, ip in (line.split() for line in rest)}


def test_two_nodes_keep_their_addresses():
    network, ips = addresses(2)
    assert str(network) == "10.77.0.0/24" and ips == {"gpu01": ipaddress.ip_address("10.77.0.11"),
                                                      "gpu02": ipaddress.ip_address("10.77.0.12")}


def test_256_nodes_have_distinct_usable_addresses_in_the_bridge_network():
    for nodes in (244, 256):
        network, ips = addresses(nodes)
        assert len(ips) == nodes and len(set(ips.values())) == nodes
        assert "gpu100" in ips and ("gpu256" in ips) == (nodes == 256)
        usable = set(network.hosts()) - {ipaddress.ip_address("10.77.0.1")}
        assert set(ips.values()) <= usable, (network, sorted(set(ips.values()) - usable)[:3])


def test_a_stop_clears_namespaces_with_three_digit_node_numbers():
    listed = 'ip() { printf "%s\\n" "hpctrain-gpu07 (id: 1)" "hpctrain-gpu100 (id: 2)" "hpctrain-gpu256" "other-ns"; }'
    out = bash(f"{listed}; stop_nodes", 2)
    assert out.split() == ["gpu01", "gpu02", "gpu07", "gpu100", "gpu256"]
