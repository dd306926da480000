"""Ladder step live_kernel_moves (with the live rung, on fresh roots of its own, so it runs beside converge): a
driver install on a live EL9 node whose package transaction would bring a newer kernel-core in. EL's kernel-core
%posttrans makes that kernel GRUB's default during the run (the grubby stand-in), so a module built for the kernel
read before the transaction is missing from the kernel the node boots next (issue 29 item 6).

  a. The mirror has moved on to the next minor release (baseos-moved-on: no package of the node's kernel, whose
     kernel-devel the image build left installed). EPEL's dkms requires kernel-devel-matched; only the newer
     kernel's exists, and it requires its own kernel-core.
  b. kernel-devel-matched of the node's kernel exists, but a site's extra driver package asked for by its bare name
     (kernel-modules-extra: dnf takes the newest build, which requires the newer kernel-core) brings the newer kernel
     in the driver's own transaction. Only reading GRUB's default again after the transaction (boot_kernel_after.yml)
     catches this one.

The check for both: the kernel GRUB boots next has nvidia.ko, or the run stopped before building anything, and
said which kernel to do what with."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import ladder_lib as lib
from fake_repos import build as fake_repos
from rungs_packages import IMAGE_KERNEL

NEWER_KERNEL = fake_repos.NEWER_KERNEL + ".x86_64"


def grub_default(root: Path) -> str:
    """The kernel the node boots next: the grubby stand-in's saved_entry in the root."""
    grubenv = root / "boot" / "grub2" / "grubenv"
    found = re.search(r"^saved_entry=(\S+)$", grubenv.read_text(), re.M) if grubenv.exists() else None
    return found.group(1) if found else ""


def fresh_live_node(name: str, repos: Path, baseos: str) -> dict[str, Path]:
    """A live node with no driver yet, running the image's kernel, whose kernel-devel and kernel-headers the image
    build left installed; its BaseOS mirror is `baseos` (a directory of the fake repositories)."""
    node = lib.make_image_root(name, repos, lock_active=True)
    root = node["root"]
    lib.rpm_install(root, sorted((repos / "baseos").glob(f"kernel-devel-{fake_repos.KERNEL}.*.rpm"))
                    + sorted((repos / "baseos").glob(f"kernel-headers-{fake_repos.KERNEL}.*.rpm")))
    (root / "etc" / "yum.repos.d" / "site-baseos.repo").write_text(
        f"[site-baseos]\nname=Site BaseOS mirror (fake)\nbaseurl=file://{repos / baseos}/\nenabled=1\ngpgcheck=0\n")
    (root / "etc" / "dnf" / "plugins").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "dnf" / "plugins" / "versionlock.list").write_text("")  # as the plugin ships it
    lib.set_running_kernel(root, IMAGE_KERNEL)
    machine = lib.WORK / f"{name}-machine"
    shutil.rmtree(machine, ignore_errors=True)
    lib.build_fixture_machine(json.loads((lib.HERE / "fixtures" / "facts" / "el9.json").read_text()), machine)
    node["machine"] = machine
    return node


def play(venv: Path, node: dict[str, Path], repos: Path, label: str, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """gpu_nodes.yml --tags preflight,driver on the live node: a fresh install, no reboot asked (the reboot is the
    admin's, later: what it would boot is GRUB's default)."""
    machine = node["machine"]
    loaded = machine / "proc-driver-nvidia-version"  # absent: no driver loaded
    gpu_state = lib.write_state(lib.WORK / f"{label}-gpu.json", {"loaded_version_file": str(loaded), "gpus": 8,
                                                                 "fabric": ["Completed", "Success"]})
    slurm_state = lib.write_state(lib.WORK / f"{label}-slurm.json", {
        "calls": [], "jobs": [], "polls_until_done": 0, "units": {}, "node": {"name": "gpu01", "state": "IDLE", "reason": ""},
        "config": {"ReturnToService": "2", "ResumeTimeout": "900 sec"},
        "machine": {"root": str(node["root"]), "kernel": IMAGE_KERNEL, "loaded_version_file": str(loaded)}})
    record = lib.WORK / f"{label}.jsonl"
    env = lib.with_stand_ins(lib.ansible_env(venv, record, HPC_TRAIN_FAKE_SLURM=str(slurm_state), HPC_TRAIN_FAKE_GPU=str(gpu_state)),
                             "fake_slurm", "fake_gpu")
    result = lib.run([str(venv / "bin" / "ansible-playbook"), "-i", str(lib.EXAMPLE), "-i", str(lib.HERE / "inventories" / "converge" / "hosts.yml"),
                      "--limit", "el9-image", "--tags", "preflight,driver", "-e", f"fixtures_dir={lib.HERE / 'fixtures'}",
                      "-e", f"fake_repos={repos}", "-e", f"gpu_stack_sysroot={node['root']}", "-e", f"gpu_stack_dnf_conf_file={node['conf']}",
                      "-e", "gpu_stack_releasever=9", "-e", "gpu_stack_manage_services=false",
                      "-e", f"gpu_preflight_pci_devices_path={machine}/sys/bus/pci/devices",
                      "-e", f"gpu_preflight_efivars_path={machine}/sys/firmware/efi/efivars",
                      "-e", f"nvidia_driver_loaded_version_file={loaded}", "-e", "nvidia_driver_expected_gpus=8",
                      # The blacklist of nouveau is new on a fresh node: its initramfs rebuild (dracut) is a no-op here.
                      "-e", json.dumps({"fixture_fact_overrides": {"kernel": IMAGE_KERNEL}, "gpu_nodes_rollout_batches": ["100%"],
                                        "nvidia_driver_initramfs_command": ["true"]}),
                      *extra, "live_change.yml"],
                     env, lib.WORK / "logs" / f"{label}.log")
    return result, lib.read_records(record)


def next_boot_has_module(root: Path, result: subprocess.CompletedProcess) -> tuple[bool, str]:
    """A run that succeeded leaves nvidia.ko for the kernel GRUB boots next (the one the admin's reboot boots)."""
    boots = grub_default(root)
    modules = lib.built_modules(root, boots) if boots else []
    return result.returncode == 0 and modules != [], f"rc={result.returncode}; GRUB boots {boots or '?'} next; nvidia.ko there: {modules}"


def kernel_moves(ladder, venv: Path) -> None:
    repos = lib.ensure_repos("repos")

    # a. The mirror moved on: kernel-devel-matched exists only for the newer kernel.
    node = fresh_live_node("kernel-moves-a", repos, "baseos-moved-on")
    root = node["root"]
    before = lib.rpm_packages(root)
    result, records = play(venv, node, repos, "kernel-moves-a")
    failure = (lib.first_failure(records, "el9-image") or {}).get("msg", "")
    ok, detail = next_boot_has_module(root, result)
    stopped = result.returncode != 0 and lib.rpm_packages(root) == before and grub_default(root) == IMAGE_KERNEL
    ladder.check("live/kernel-devel-matched of the node's kernel gone from the mirror (moved on a minor release): "
                 "the kernel GRUB boots next has nvidia.ko, or the run stopped with nothing changed",
                 ok or stopped,
                 f"{detail}\nnew packages: {sorted(lib.rpm_packages(root) - before)}\n{failure}")
    matched = f"kernel-devel-matched-{IMAGE_KERNEL}"
    ladder.check("live/... stopped by the preflight with a message that names the package and what to do",
                 failure.startswith(f"gpu_preflight: {matched} is not in any enabled repository (usually: the mirror has moved on")
                 and "enable the vault repository" in failure and "update the kernel first" in failure
                 and f"No package {matched} available" in failure, failure)

    # b. kernel-devel-matched of the node's kernel is there; a site's extra package brings the newer kernel-core. The
    #    site follows the branch's newest release (gpu_stack_driver_version "", the default): its extra packages are
    #    then asked for by their bare names (with a pinned version they get the driver's version appended).
    node = fresh_live_node("kernel-moves-b", repos, "baseos")
    root = node["root"]
    site = ["-e", "gpu_stack_driver_version=", "-e", '{"nvidia_driver_extra_packages": ["kernel-modules-extra"]}']
    result, records = play(venv, node, repos, "kernel-moves-b", *site)
    failure = (lib.first_failure(records, "el9-image") or {}).get("msg", "")
    ok, detail = next_boot_has_module(root, result)
    # build.yml's first task: reached (run or skipped) only by a run that went on to the build.
    build_reached = [r["status"] for r in records if r["task"].endswith("Read the installed driver and look for its module")]
    ladder.check("live/a site's extra package brings a newer kernel-core in the driver's transaction: the kernel GRUB "
                 "boots next has nvidia.ko, or the run stopped before the build",
                 ok or (result.returncode != 0 and build_reached == [] and grub_default(root) == NEWER_KERNEL),
                 f"{detail}\nbuild step reached: {build_reached}\n{failure}")
    # The rerun the message asks for builds for the kernel GRUB boots next: live_change's 7b shows that case (a
    # default kernel that is not the running one); not repeated here (about 45 s).
    ladder.check("live/... stopped after the transaction, naming both kernels and the rerun",
                 failure.startswith(f"nvidia_driver: the package transaction on el9-image moved GRUB's default kernel from {IMAGE_KERNEL} "
                                    f"to {NEWER_KERNEL}") and "Rerun" in failure and f"kernel-modules-extra-{fake_repos.NEWER_KERNEL}"
                 in lib.rpm_packages(root), failure)
