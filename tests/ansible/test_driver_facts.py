"""The nvidia_driver_facts module (ansible/roles/nvidia_driver/library/) against canned /proc/driver/nvidia/version,
modinfo and rpm output (fixtures/driver_facts/, in the formats the real files and tools print): its parsers one by
one, then the module itself, run as Ansible runs it (a Python process given its arguments as JSON) with stand-in
rpm and modinfo first on PATH. The roles' use of it on real modinfo output is the converge and live rungs'."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MODULE = HERE.parent.parent / "ansible" / "roles" / "nvidia_driver" / "library" / "nvidia_driver_facts.py"
CANNED = HERE / "fixtures" / "driver_facts"
KERNEL = "5.14.0-427.13.1.el9_4.x86_64"
BOOT_KERNEL = "5.14.0-503.11.1.el9_5.x86_64"


def load_module():
    sys.dont_write_bytecode = True  # no __pycache__ next to the module: ansible/ ships whole in the wheel
    spec = importlib.util.spec_from_file_location("nvidia_driver_facts", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


facts = load_module()


@pytest.mark.parametrize("name, expected", [
    ("proc-version-open.txt", {"version": "570.172.08", "flavor": "open"}),
    ("proc-version-open-aarch64.txt", {"version": "570.172.08", "flavor": "open"}),
    ("proc-version-proprietary.txt", {"version": "550.163.01", "flavor": "proprietary"}),
])
def test_loaded_driver_from_proc(name: str, expected: dict) -> None:
    assert facts.parse_loaded((CANNED / name).read_text()) == expected


def test_no_loaded_driver_is_data() -> None:
    assert facts.parse_loaded("") == {"version": "", "flavor": ""}


def test_a_version_file_that_names_no_version_has_no_flavour() -> None:
    # Not "proprietary": a text without a version says nothing about the flavour either.
    assert facts.parse_loaded("NVRM: something else entirely\n") == {"version": "", "flavor": ""}


@pytest.mark.parametrize("name, expected", [
    ("modinfo-open.txt", {"version": "570.172.08", "flavor": "open", "signer": "DKMS module signing key",
                          "sig_key": "3A:1F:0C:77:51:9E:6B:20"}),
    ("modinfo-proprietary.txt", {"version": "550.163.01", "flavor": "proprietary", "signer": "", "sig_key": ""}),
    # the real modinfo (kmod 30) on a stand-in module signed by the kernel's sign-file (Secure Boot, issue 29)
    ("modinfo-signed.txt", {"version": "570.1", "flavor": "open", "signer": "Site MOK",
                            "sig_key": "4D:5E:99:1D:BB:39:37:4F:3E:AF:57:76:96:5B:0F:95:FC:8B:DF:6A"}),
])
def test_module_version_and_flavour_from_modinfo(name: str, expected: dict) -> None:
    # srcversion: and vermagic: must not be taken for version:
    assert facts.parse_modinfo((CANNED / name).read_text()) == expected


def test_unknown_licence_is_kept_as_is() -> None:
    assert facts.parse_modinfo("version:        1.0\nlicense:        GPL\n") == {"version": "1.0", "flavor": "GPL", "signer": "",
                                                                                     "sig_key": ""}


def test_enabled_stream_only() -> None:
    text = (CANNED / "nvidia-driver.module").read_text()
    assert facts.parse_stream(text) == "570-open"
    assert facts.parse_stream(text.replace("state=enabled", "state=disabled")) == ""
    assert facts.parse_stream("") == ""


def test_installed_driver_prefers_the_open_kmod_and_sees_fabric_manager() -> None:
    packages = {"kmod-nvidia-open-dkms": "570.172.08", "nvidia-fabric-manager": "570.172.08", "nvidia-driver-cuda": "570.172.08"}
    assert facts.installed_driver(packages, facts.KMOD_PACKAGES) == {"version": "570.172.08", "flavor": "open", "fabricmanager": True}
    assert facts.installed_driver({"kmod-nvidia-latest-dkms": "550.163.01"}, facts.KMOD_PACKAGES) == {
        "version": "550.163.01", "flavor": "proprietary", "fabricmanager": False}
    assert facts.installed_driver({}, facts.KMOD_PACKAGES) == {"version": "", "flavor": "", "fabricmanager": False}


def test_driver_version_el9_and_el7_names() -> None:
    assert facts.driver_version({"nvidia-driver-cuda": "570.172.08", "nvidia-driver": "1"}) == "570.172.08"
    assert facts.driver_version({"nvidia-driver-branch-550-cuda": "550.163.01"}) == "550.163.01"
    assert facts.driver_version({"nvidia-driver": "550.163.01"}) == "550.163.01"
    assert facts.driver_version({"nvidia-container-toolkit": "1.17.7"}) == ""


# ------------------------------------------------------------------------------------------------ the module itself


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.fixture()
def node(tmp_path: Path) -> dict:
    """A node root with an open 570 module built for KERNEL and a proprietary 550 one for BOOT_KERNEL; rpm lists the
    open 570 driver and a container toolkit; modinfo prints the canned text named by the module file's content."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    bin_dir.mkdir()
    for kernel, canned, sub in ((KERNEL, "modinfo-open.txt", "extra/nvidia.ko.xz"), (BOOT_KERNEL, "modinfo-proprietary.txt", "updates/dkms/nvidia.ko")):
        module_file = root / "lib" / "modules" / kernel / sub
        module_file.parent.mkdir(parents=True)
        module_file.write_text(str(CANNED / canned))
    # Another module of the driver, which modinfo reads just as well: not the one that says the driver is built.
    (root / "lib" / "modules" / KERNEL / "extra" / "nvidia-uvm.ko.xz").write_text(str(CANNED / "modinfo-proprietary.txt"))
    (root / "etc" / "dnf" / "modules.d").mkdir(parents=True)
    (root / "etc" / "dnf" / "modules.d" / "nvidia-driver.module").write_text((CANNED / "nvidia-driver.module").read_text())
    rpm_list = tmp_path / "rpm-qa.txt"
    rpm_list.write_text("nvidia-driver-cuda 570.172.08\nkmod-nvidia-open-dkms 570.172.08\nnvidia-container-toolkit 1.17.7\n")
    # The stand-in answers only the query the module makes, for this root.
    stand_in(bin_dir, "rpm", f'[ "$1 $2 $3" = "--root {root} -qa" ] || exit 9\ncat {rpm_list}\n')
    stand_in(bin_dir, "modinfo", 'cat "$(cat "$1")"\n')
    return {"root": root, "bin": bin_dir, "tmp": tmp_path, "rpm_list": rpm_list}


def run_module(node: dict, **args: object) -> dict:
    args_file = node["tmp"] / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"root": str(node["root"]), **args}}))
    env = {**os.environ, "PATH": f"{node['bin']}:{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-B", str(MODULE), str(args_file)], capture_output=True, text=True, env=env)
    return json.loads(result.stdout)


def test_module_reports_loaded_installed_and_built_for_a_kernel(node: dict) -> None:
    result = run_module(node, kernel=KERNEL, loaded_version_file=str(CANNED / "proc-version-open.txt"))
    assert not result.get("failed") and result["changed"] is False
    assert result["kernel"] == KERNEL
    assert result["loaded"] == {"version": "570.172.08", "flavor": "open"}
    assert result["installed"] == {"version": "570.172.08", "flavor": "open", "fabricmanager": False}
    assert result["driver_version"] == "570.172.08" and result["stream"] == "570-open"
    assert result["packages"]["nvidia-container-toolkit"] == "1.17.7"
    assert [(Path(m["path"]).name, m["version"], m["flavor"]) for m in result["modules"]] == [("nvidia.ko.xz", "570.172.08", "open")]
    assert result["built"] == ["570.172.08 open"] and result["module_built"] is True and result["version_mismatch"] is False


def test_module_asked_for_the_kernel_the_node_will_boot(node: dict) -> None:
    # Built there is only the proprietary 550 module: the installed open 570 driver is not built for that kernel.
    result = run_module(node, kernel=BOOT_KERNEL, loaded_version_file=str(CANNED / "proc-version-open.txt"))
    assert result["kernel"] == BOOT_KERNEL
    assert [(m["version"], m["flavor"]) for m in result["modules"]] == [("550.163.01", "proprietary")]
    assert result["module_built"] is False


def test_module_defaults_to_the_running_kernel_on_the_live_root(node: dict) -> None:
    stand_in(node["bin"], "rpm", "exit 0\n")  # any root: no packages
    result = run_module(node, root="/", loaded_version_file=str(CANNED / "proc-version-open.txt"))
    assert not result.get("failed") and result["kernel"] == os.uname().release


def test_an_image_root_without_a_kernel_is_refused(node: dict) -> None:
    # The running kernel is the build host's: meaningless for an image root.
    result = run_module(node, loaded_version_file=str(CANNED / "proc-version-open.txt"))
    assert result["failed"] is True and result["msg"] == (
        f"nvidia_driver_facts: root {node['root']} is not /, so kernel must be given (the running kernel is this host's, not "
        "the root's)")


@pytest.mark.parametrize("kernel", ["../../etc", "5.14.0/../../x", "", "."])
def test_a_kernel_that_is_not_a_release_is_refused(node: dict, kernel: str) -> None:
    result = run_module(node, kernel=kernel, root="/")
    assert result["failed"] is True and "kernel must be a kernel release as uname -r prints it" in result["msg"]


def test_kmod_packages_without_both_flavours_is_refused(node: dict) -> None:
    result = run_module(node, kernel=KERNEL, kmod_packages={"open": "kmod-nvidia-open-dkms"})
    assert result["failed"] is True and "traceback" not in json.dumps(result).lower()
    assert result["msg"].startswith("nvidia_driver_facts: kmod_packages must name the package of both flavours")


def test_kmod_and_userspace_at_other_versions_is_a_mismatch(node: dict) -> None:
    node["rpm_list"].write_text("nvidia-driver-cuda 570.172.08\nkmod-nvidia-open-dkms 570.133.20\n")
    result = run_module(node, kernel=KERNEL)
    assert result["version_mismatch"] is True and result["installed"]["version"] == "570.133.20"
    assert result["driver_version"] == "570.172.08"


def test_precompiled_kmods_are_reported(node: dict) -> None:
    node["rpm_list"].write_text("nvidia-driver-cuda 570.172.08\nkmod-nvidia-570.172.08-5.14.0-503.11.1 570.172.08\n")
    result = run_module(node, kernel=KERNEL)
    assert result["precompiled"] == ["kmod-nvidia-570.172.08-5.14.0-503.11.1"] and result["installed"]["flavor"] == ""
    assert result["version_mismatch"] is False


def test_no_driver_at_all_is_data_not_a_failure(node: dict) -> None:
    node["rpm_list"].write_text("")
    result = run_module(node, kernel="6.1.0-no-such-kernel", loaded_version_file=str(node["tmp"] / "absent"))
    assert not result.get("failed")
    assert result["loaded"] == {"version": "", "flavor": ""}
    assert result["installed"] == {"version": "", "flavor": "", "fabricmanager": False}
    assert result["modules"] == [] and result["module_built"] is False and result["driver_version"] == ""
    assert result["built"] == [] and result["precompiled"] == [] and result["version_mismatch"] is False
    assert result["how"] == {"method": "", "version": "", "flavor": "", "packages": [], "evidence": []}


def test_rpm_failure_is_a_failure_with_the_reason(node: dict) -> None:
    stand_in(node["bin"], "rpm", "echo 'error: cannot open Packages database' >&2\nexit 1\n")
    result = run_module(node, kernel=KERNEL)
    assert result["failed"] is True and "cannot open Packages database" in result["msg"]


# ------------------------------------------------------------------------------------------------ how it was installed
# A driver installed another way is a driver, not "no driver" (issue 29 item 3): the role would otherwise take the node
# for a fresh install and change packages under running jobs with no drain. The rpm lists are fixtures/driver_facts/
# rpm-*.txt: NVIDIA's EL7 latest-dkms flavour (yum-packaging-nvidia-driver's rhel7 names), ELRepo's kmod-nvidia and
# its legacy 470xx, NVIDIA's DKMS packages as this role installs them.


def packages_of(name: str) -> dict:
    return dict(line.split(" ", 1) for line in (CANNED / name).read_text().splitlines())


NO_LOAD = {"version": "", "flavor": ""}


@pytest.mark.parametrize("rpm_list, method, version, flavor, some_packages", [
    ("rpm-el7-latest-dkms.txt", "nvidia-el7-latest-dkms", "550.163.01", "proprietary",
     ["kmod-nvidia-latest-dkms", "nvidia-driver-latest-dkms", "nvidia-driver-latest-dkms-cuda"]),
    ("rpm-elrepo.txt", "elrepo-kmod", "550.135", "proprietary", ["kmod-nvidia", "nvidia-x11-drv", "nvidia-x11-drv-libs"]),
    ("rpm-elrepo-legacy.txt", "elrepo-kmod", "470.256.02", "proprietary", ["kmod-nvidia-470xx", "nvidia-x11-drv-470xx"]),
    ("rpm-nvidia-dkms.txt", "nvidia-dkms", "570.172.08", "open", []),
])
def test_how_a_packaged_driver_was_installed(tmp_path: Path, rpm_list: str, method: str, version: str, flavor: str,
                                             some_packages: list) -> None:
    how = facts.install_method(str(tmp_path), packages_of(rpm_list), facts.KMOD_PACKAGES, NO_LOAD, [])
    assert (how["method"], how["version"], how["flavor"]) == (method, version, flavor)
    assert set(some_packages) <= set(how["packages"]) and "nvidia-container-toolkit" not in how["packages"]
    if method == "nvidia-dkms":
        assert how["packages"] == []  # this role's own install: nothing to remove on a change


def test_elrepo_legacy_kmod_is_not_taken_for_a_precompiled_one() -> None:
    assert facts.precompiled_kmods(packages_of("rpm-elrepo-legacy.txt"), facts.KMOD_PACKAGES) == []


@pytest.mark.parametrize("leftover", ["usr/bin/nvidia-uninstall", "usr/bin/nvidia-installer"])
def test_runfile_install_is_told_by_its_files_even_next_to_packages(tmp_path: Path, leftover: str) -> None:
    (tmp_path / leftover).parent.mkdir(parents=True)
    (tmp_path / leftover).write_text("#!/bin/sh\n")
    how = facts.install_method(str(tmp_path), packages_of("rpm-nvidia-dkms.txt"), facts.KMOD_PACKAGES, NO_LOAD, [])
    assert how["method"] == "runfile" and how["evidence"] == ["/" + leftover]


def test_runfile_install_is_told_by_a_module_no_package_owns(tmp_path: Path) -> None:
    module = [{"path": "/lib/modules/k/kernel/drivers/video/nvidia.ko", "version": "550.163.01", "flavor": "proprietary"}]
    how = facts.install_method(str(tmp_path), {"nvidia-container-toolkit": "1.17.7"}, facts.KMOD_PACKAGES, NO_LOAD, module)
    assert (how["method"], how["version"], how["flavor"]) == ("runfile", "550.163.01", "proprietary")


def test_a_loaded_driver_without_packages_is_a_runfile_on_the_live_root_only(tmp_path: Path) -> None:
    loaded = {"version": "550.163.01", "flavor": "proprietary"}
    assert facts.install_method("/", {}, facts.KMOD_PACKAGES, loaded, [])["method"] == "runfile"
    # An image root's "loaded" driver is the build host's.
    assert facts.install_method(str(tmp_path), {}, facts.KMOD_PACKAGES, loaded, [])["method"] == ""


def test_module_reports_an_elrepo_driver(node: dict) -> None:
    node["rpm_list"].write_text((CANNED / "rpm-elrepo.txt").read_text())
    result = run_module(node, kernel=KERNEL)
    assert result["how"]["method"] == "elrepo-kmod" and result["how"]["version"] == "550.135"


def test_module_reports_a_runfile_install(node: dict) -> None:
    node["rpm_list"].write_text("")
    bin_dir = node["root"] / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvidia-uninstall").symlink_to("nvidia-installer")  # as the .run leaves it (a dangling link counts)
    result = run_module(node, kernel=KERNEL)
    assert result["how"]["method"] == "runfile" and "/usr/bin/nvidia-uninstall" in result["how"]["evidence"]
    assert result["how"]["version"] == "570.172.08"  # the module it left for the kernel
