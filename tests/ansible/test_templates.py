"""Pure-Jinja tests of the role templates against golden files (no Ansible run).

The environment mimics the template module's: trim_blocks, StrictUndefined (a missing variable fails), the
role's templates directory as the loader path, and the two Ansible filters the templates use. The same templates
are also rendered by real Ansible in the check-mode and converge phases of the ladder.
Regenerate the golden files after an intended change: HPC_TRAIN_UPDATE_GOLDEN=1 (tests/golden_files.py).
"""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jinja2
import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the repository: the golden-file check both suites share

from tests.golden_files import check_golden as shared_check  # noqa: E402
ROLES = HERE.parent.parent / "ansible" / "roles"
EXAMPLE = HERE.parent.parent / "ansible" / "inventories" / "example"
GOLDEN = HERE / "golden"
MANAGED = "Ansible managed"


def render(role: str, template: str, **variables: object) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROLES / role / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["bool"] = lambda value: value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    env.filters["to_json"] = lambda value: __import__("json").dumps(value)
    env.filters["basename"] = os.path.basename
    return env.get_template(template).render(ansible_managed=MANAGED, **variables)


def check_golden(name: str, text: str) -> None:
    shared_check(GOLDEN / name, text, how_to_update="bash tests/ansible/run.sh")


def example_gres() -> list[dict]:
    return yaml.safe_load((EXAMPLE / "group_vars" / "gpu_nodes.yml").read_text())["slurm_gpu_node_gres"]


def gres_vars(gres: list[dict], autodetect: str = "off") -> dict:
    return {"slurm_gpu_node_gres": gres, "slurm_gpu_node_gres_autodetect": autodetect}


def test_gres_conf_of_the_example_inventory() -> None:
    check_golden("gres.conf", render("slurm_gpu_node", "gres.conf.j2", **gres_vars(example_gres())))


def test_gres_conf_mixed_types_single_device_and_no_cores() -> None:
    gres = [{"type": "a100", "devices": "0-1", "cores": "0-15"}, {"type": "l40s", "devices": 2}, {"name": "gpu", "type": "l40s", "devices": "3"}]
    check_golden("gres-mixed.conf", render("slurm_gpu_node", "gres.conf.j2", **gres_vars(gres)))


def test_gres_conf_nvml_autodetect_has_no_file_lines() -> None:
    text = render("slurm_gpu_node", "gres.conf.j2", **gres_vars(example_gres(), "nvml"))
    check_golden("gres-nvml.conf", text)
    assert "File=" not in text


def _hostvars(gres_by_host: dict[str, list[dict]], extra: dict[str, dict] | None = None) -> dict:
    facts = {"processor_vcpus": 96, "processor_count": 2, "processor_cores": 24, "processor_threads_per_core": 2,
             "memtotal_mb": 1031530}
    return {h: {"ansible_facts": {**facts, "hostname": h}, "slurm_gpu_node_gres": g, **(extra or {}).get(h, {})}
            for h, g in gres_by_host.items()}


def _nodename_conf(gres_by_host: dict[str, list[dict]], extra: dict[str, dict] | None = None) -> str:
    return render(
        "slurm_gpu_node", "slurm-gpu-nodes.conf.j2", groups={"gpu_nodes": list(reversed(gres_by_host))},
        hostvars=_hostvars(gres_by_host, extra), slurm_gpu_node_group="gpu_nodes", slurm_gpu_node_reserved_memory_mb=4096,
        slurm_gpu_node_controller_conf="/etc/slurm/hpc-train-gpu-nodes.conf", slurm_gpu_node_nodename_extra="Feature=hgx",
    )


MIXED = [{"type": "a100", "devices": "0-1"}, {"type": "l40s", "devices": "2-3"}, {"type": "a100", "devices": "4"}]


def test_controller_nodename_lines() -> None:
    """gpu02's Slurm NodeName is mapped (gpu_stack_slurm_node_name): its line uses that name and says which host it is
    (slurmd on host gpu02 finds its NodeName by NodeHostName); gpu01's address is given (gpu_stack_slurm_node_addr)."""
    text = _nodename_conf({"gpu01": example_gres(), "gpu02": MIXED},
                          {"gpu02": {"gpu_stack_slurm_node_name": "gpu-b02"}, "gpu01": {"gpu_stack_slurm_node_addr": "10.10.1.1"}})
    check_golden("slurm-gpu-nodes.conf", text)
    lines = [line for line in text.splitlines() if line.startswith("NodeName=")]
    assert lines[0].startswith("NodeName=gpu01 NodeAddr=10.10.1.1 CPUs=") and "NodeHostName" not in lines[0]
    assert lines[1].startswith("NodeName=gpu-b02 NodeHostName=gpu02 CPUs=") and "NodeAddr" not in lines[1]


def test_configless_gres_lines_on_the_controller() -> None:
    """Configless nodes read gres.conf from slurmctld: one NodeName-qualified line per GPU group, or AutoDetect."""
    text = render("slurm_gpu_node", "gres-nodes.conf.j2", groups={"gpu_nodes": ["gpu02", "gpu01", "gpu03"]},
                  hostvars=_hostvars({"gpu01": example_gres(), "gpu02": MIXED, "gpu03": example_gres()},
                                     {"gpu02": {"gpu_stack_slurm_node_name": "gpu-b02"}, "gpu03": {"slurm_gpu_node_gres_autodetect": "nvml"}}),
                  slurm_gpu_node_group="gpu_nodes")
    check_golden("gres-nodes.conf", text)
    lines = text.splitlines()
    assert lines[0] == "NodeName=gpu01 Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-23"
    assert "NodeName=gpu-b02 Name=gpu Type=l40s File=/dev/nvidia[2-3]" in lines and lines[-1] == "NodeName=gpu03 AutoDetect=nvml"


@pytest.mark.parametrize(
    "gres",
    [
        [{"type": "h100", "devices": "0-7"}],
        [{"type": "h100", "devices": "0-3"}, {"type": "h100", "devices": "4-7"}],
        [{"type": "a100", "devices": "0"}, {"type": "t4", "devices": "1-2"}, {"type": "a100", "devices": "3-5"}],
        [{"name": "gpu", "type": "mig", "devices": "0-13"}],
    ],
)
def test_nodename_gres_counts_match_gres_conf_files(gres: list[dict]) -> None:
    """The controller's Gres= counts and the devices gres.conf lists come from one list and must agree."""
    files: dict[str, int] = {}
    for line in render("slurm_gpu_node", "gres.conf.j2", **gres_vars(gres)).splitlines():
        match = re.fullmatch(r"Name=(\S+) Type=(\S+) File=/dev/nvidia(?:\[(\d+)-(\d+)\]|(\d+))(?: Cores=\S+)?", line)
        if match:
            name, gtype, first, last, single = match.groups()
            count = int(last) - int(first) + 1 if first else 1
            files[f"{name}:{gtype}"] = files.get(f"{name}:{gtype}", 0) + count
    node_line = _nodename_conf({"n1": gres}).splitlines()[-1]
    gres_field = re.search(r" Gres=(\S+)", node_line).group(1)
    declared = {item.rsplit(":", 1)[0]: int(item.rsplit(":", 1)[1]) for item in gres_field.split(",")}
    assert declared == files


def test_modprobe_options_are_sorted_on_one_line() -> None:
    text = render("nvidia_driver", "nvidia-modprobe.conf.j2",
                  nvidia_driver_modprobe_options={"NVreg_RestrictProfilingToAdminUsers": 0, "NVreg_EnableStreamMemOPs": 1})
    check_golden("nvidia-hpc-train.conf", text)


def test_modprobe_without_options_sets_nothing() -> None:
    text = render("nvidia_driver", "nvidia-modprobe.conf.j2", nvidia_driver_modprobe_options={})
    assert [line for line in text.splitlines() if line.startswith("options")] == []


def test_nouveau_blacklist() -> None:
    check_golden("blacklist-nouveau.conf", render("nvidia_driver", "blacklist-nouveau.conf.j2"))


def _repo_vars(major: str, arch: str, **overrides: object) -> dict:
    variables = {
        "ansible_facts": {"distribution_major_version": major, "architecture": arch},
        "__nvidia_driver_arch": "sbsa" if arch == "aarch64" else arch,
        "nvidia_driver_cuda_repo_baseurl": f"https://developer.download.nvidia.com/compute/cuda/repos/rhel{major}/{'sbsa' if arch == 'aarch64' else arch}/",
        "nvidia_driver_cuda_repo_gpgkey": "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/D42D0685.pub",
        "nvidia_driver_repo_gpgcheck": True,
        "nvidia_driver_epel_enabled": True,
        "nvidia_driver_epel_baseurl": "",
        "nvidia_driver_epel_gpgkey": "",
        "__nvidia_driver_epel_default_baseurl": yaml.safe_load((ROLES / "nvidia_driver" / "vars" / f"RedHat-{major}.yml").read_text())[
            "__nvidia_driver_epel_default_baseurl"].replace("{{ ansible_facts['architecture'] }}", arch),
        "__nvidia_driver_epel_gpgkey": yaml.safe_load((ROLES / "nvidia_driver" / "vars" / f"RedHat-{major}.yml").read_text())[
            "__nvidia_driver_epel_gpgkey"],
        "nvidia_driver_proxy_env": {},
    }
    variables.update(overrides)
    return variables


def test_repo_file_el9_with_proxy() -> None:
    text = render("nvidia_driver", "hpc-train-gpu.repo.j2",
                  **_repo_vars("9", "x86_64", nvidia_driver_proxy_env={"https_proxy": "http://proxy.example:3128"}))
    check_golden("hpc-train-gpu-el9.repo", text)
    assert text.count("proxy=http://proxy.example:3128") == 2


def test_repo_file_el7_archive_epel_without_gpgcheck() -> None:
    text = render("nvidia_driver", "hpc-train-gpu.repo.j2", **_repo_vars("7", "x86_64", nvidia_driver_repo_gpgcheck=False))
    check_golden("hpc-train-gpu-el7.repo", text)
    assert "gpgkey" not in text and "archives.fedoraproject.org/pub/archive/epel/7/x86_64/" in text


def test_repo_file_el9_aarch64_uses_sbsa_and_no_epel_when_disabled() -> None:
    text = render("nvidia_driver", "hpc-train-gpu.repo.j2", **_repo_vars("9", "aarch64", nvidia_driver_epel_enabled=False))
    check_golden("hpc-train-gpu-el9-aarch64.repo", text)
    assert "[hpc-train-epel]" not in text and "/rhel9/sbsa/" in text


def test_cuda_profile_script() -> None:
    text = render("cuda_toolkit", "cuda.sh.j2", cuda_toolkit_version="12.8", __cuda_toolkit_home="/usr/local/cuda-12.8")
    check_golden("cuda.sh", text)


@pytest.mark.parametrize("trust_all", [True, False])
def test_fabric_zone_is_valid_xml_with_the_sources_and_ports(trust_all: bool) -> None:
    text = render("slurm_gpu_node", "hpc-train-fabric.xml.j2", slurm_gpu_node_fabric_trust_all=trust_all,
                  slurm_gpu_node_fabric_sources=["10.10.0.0/16", "192.168.4.0/22"], slurm_gpu_node_slurmd_port=6818,
                  slurm_gpu_node_srun_port_range="60001-63000", slurm_gpu_node_rendezvous_port_range="29400-29999")
    zone = ET.fromstring(text.encode())
    assert zone.get("target") == ("ACCEPT" if trust_all else None)
    assert [s.get("address") for s in zone.findall("source")] == ["10.10.0.0/16", "192.168.4.0/22"]
    assert [p.get("port") for p in zone.findall("port")] == ["6818", "60001-63000", "29400-29999"]
    if trust_all:
        check_golden("hpc-train-fabric.xml", text)


def test_torch_requirements_pin_the_cuda_build() -> None:
    text = render("pytorch_env", "requirements.txt.j2", pytorch_env_torch_version="2.7.1", pytorch_env_torchvision_version="0.22.1",
                  pytorch_env_cuda_tag="cu128", pytorch_env_hpc_train_spec="hpc-train[train]==0.1.0",
                  pytorch_env_extra_packages=["nvidia-ml-py==12.570.86"])
    check_golden("hpc-train-requirements.txt", text)


def test_a_missing_variable_fails_the_render() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render("slurm_gpu_node", "gres.conf.j2", slurm_gpu_node_gres_autodetect="off")
