"""slurm_gpu_node's slurm_conf_read module (library/slurm_conf_read.py): slurm.conf with the files its Include lines
name, as slurm.conf(5) says Slurm reads them (relative to slurm.conf's directory, %c, wildcards, nested, inline), under
a test root. What real Slurm makes of included files is the real_slurm rung's (its slurm.conf includes the site's
keys, and real slurmctld reports the merged GresTypes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MODULE = Path(__file__).resolve().parent.parent.parent / "ansible" / "roles" / "slurm_gpu_node" / "library" / "slurm_conf_read.py"


def load():
    sys.dont_write_bytecode = True  # ansible/ ships whole in the wheel: no __pycache__ next to the module
    spec = importlib.util.spec_from_file_location("slurm_conf_read", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


read = load()


def site(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)


def test_includes_are_read_inline_relative_with_cluster_name_wildcards_and_nesting(tmp_path: Path) -> None:
    site(tmp_path, {
        "/etc/slurm/slurm.conf": "ClusterName=alpha\nGresTypes=mps\nInclude site-%c.conf\nInclude /etc/slurm/conf.d/*.conf\n"
                                 "Include hpc-train-gpu-nodes.conf\nHealthCheckInterval=30\n",
        "/etc/slurm/site-alpha.conf": "GresTypes=bandwidth  # the site's\nInclude nested.conf\n",
        "/etc/slurm/nested.conf": "NodeName=gpu01 CPUs=4\n",
        "/etc/slurm/conf.d/b.conf": "HealthCheckProgram=/usr/sbin/nhc\n",
        "/etc/slurm/conf.d/a.conf": "PropagateResourceLimits=ALL\n",
        "/etc/slurm/hpc-train-gpu-nodes.conf": "NodeName=gpu02 CPUs=4\n",
    })
    reader = read.Reader(str(tmp_path), "/etc/slurm", ["hpc-train-gpu-nodes.conf"])
    text = reader.expand("/etc/slurm/slurm.conf", 0)
    assert [f["path"] for f in reader.files] == ["/etc/slurm/slurm.conf", "/etc/slurm/site-alpha.conf", "/etc/slurm/nested.conf",
                                                 "/etc/slurm/conf.d/a.conf", "/etc/slurm/conf.d/b.conf"]
    # Slurm keeps a key's latest value: the included GresTypes wins over slurm.conf's earlier one.
    assert reader.keys == {"clustername": "/etc/slurm/slurm.conf", "grestypes": "/etc/slurm/site-alpha.conf",
                           "propagateresourcelimits": "/etc/slurm/conf.d/a.conf", "healthcheckprogram": "/etc/slurm/conf.d/b.conf",
                           "healthcheckinterval": "/etc/slurm/slurm.conf"}
    assert "NodeName=gpu01" in text and "NodeName=gpu02" not in text  # the skipped file is the roles' own
    assert text.index("GresTypes=bandwidth") > text.index("GresTypes=mps") and reader.missing == []


def test_a_missing_include_is_reported(tmp_path: Path) -> None:
    site(tmp_path, {"/etc/slurm/slurm.conf": "Include gone.conf\nInclude /etc/slurm/none.d/*.conf\n"})
    reader = read.Reader(str(tmp_path), "/etc/slurm", [])
    reader.expand("/etc/slurm/slurm.conf", 0)
    assert reader.missing == ["gone.conf", "/etc/slurm/none.d/*.conf"]


def test_an_include_loop_ends(tmp_path: Path) -> None:
    site(tmp_path, {"/etc/slurm/slurm.conf": "Include slurm.conf\n"})
    reader = read.Reader(str(tmp_path), "/etc/slurm", [])
    reader.expand("/etc/slurm/slurm.conf", 0)
    assert len(reader.files) == read.MAX_DEPTH + 1
