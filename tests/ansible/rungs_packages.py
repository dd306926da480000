"""Ladder rungs that install packages for real with dnf into EL9 image roots from the fake repositories:
converge (image_build.yml: install, idempotence, verify, refused and allowed flavour switch) and missing_branch
(refusals on a fresh root: a branch the mirror lacks, a kernel whose kernel-devel it lacks)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import ladder_lib as lib
from fake_repos import build as fake_repos

IMAGE_KERNEL = fake_repos.KERNEL + ".x86_64"
MISSING_KERNEL = "5.14.0-362.8.1.el9_3.x86_64"  # a kernel the fake mirror does not carry


def converge_run(venv: Path, image: dict[str, Path], repos: Path, label: str, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    record = lib.WORK / f"converge-{label}.jsonl"
    result = lib.run([str(venv / "bin" / "ansible-playbook"), "-i", str(lib.EXAMPLE), "-i", str(lib.HERE / "inventories" / "converge" / "hosts.yml"),
                      "--limit", "el9-image", "-e", f"fixtures_dir={lib.HERE / 'fixtures'}", "-e", f"fake_repos={repos}",
                      "-e", "image_build_hosts=el9-image", "-e", f"image_build_sysroot={image['root']}",
                      "-e", f"image_build_kernel_version={IMAGE_KERNEL}", "-e", f"image_build_dnf_conf_file={image['conf']}",
                      "-e", "image_build_releasever=9", *extra, "converge.yml"],
                     lib.ansible_env(venv, record), lib.WORK / "logs" / f"converge-{label}.log")
    return result, lib.read_records(record)


def task_status(records: list[dict], suffix: str) -> list[str]:
    return [("changed" if r["changed"] else r["status"]) for r in records if r["task"].endswith(suffix)]


def converge(ladder, venv: Path) -> None:
    repos = lib.ensure_repos("repos")
    ladder.check("converge/fake EL9 repositories built (rpmbuild, createrepo_c, modifyrepo_c)",
                 (repos / "cuda" / "repodata" / "repomd.xml").read_text().count('type="modules"') == 1)
    image = lib.make_image_root("image", repos)
    root = image["root"]
    # Site software already in the image that matches the driver's name patterns but is not the driver.
    toolkit_old, toolkit_new = fake_repos.CONTAINER_TOOLKIT_VERSIONS
    lib.rpm_install(root, sorted((repos / "cuda").glob(f"*-{toolkit_old}-1.x86_64.rpm")))
    old, new = fake_repos.DRIVER_VERSIONS
    driver = f"{old}-1.el9"

    result, records = converge_run(venv, image, repos, "1-converge")
    changed, failed = lib.counts(records)
    if not ladder.check("converge/first run succeeds and changes the image", result.returncode == 0 and failed == 0 and changed > 10,
                        f"rc={result.returncode} changed={changed}\n{lib.tail(result.stdout, 25)}"):
        return
    # NVIDIA's %post built for the build host's `uname -r` (and its failure was ignored), so the role had to build.
    ladder.check("converge/the kmod's %post built no module for the image's kernel; the role ran dkms autoinstall -k for it",
                 task_status(records, "Build the module with DKMS") == ["changed"], str(task_status(records, "Build the module with DKMS")))
    result, records = converge_run(venv, image, repos, "2-idempotence")
    changed, failed = lib.counts(records)
    ladder.check("converge/second run changes nothing", result.returncode == 0 and changed == 0,
                 "changed: " + ", ".join(r["task"] for r in records if r["changed"]))

    # verify: what the image must contain, by intent
    packages = lib.rpm_packages(root)
    wanted = {f"nvidia-driver-cuda-{driver}", f"kmod-nvidia-open-dkms-{driver}", f"nvidia-persistenced-{driver}",
              f"nvidia-fabric-manager-{driver}", f"kernel-devel-{fake_repos.KERNEL}", f"kernel-headers-{fake_repos.KERNEL}",
              f"dkms-{fake_repos.DKMS_VERSION}-1.el9", "cuda-toolkit-12-8-12.8.1-1",
              f"libnccl-{fake_repos.NCCL_VERSION}-{fake_repos.NCCL_RELEASE}", "python3-dnf-plugin-versionlock-4.3.0-13.el9",
              "rdma-core-48.0-1.el9", f"datacenter-gpu-manager-4-cuda12-{fake_repos.DCGM_VERSION}-1",
              f"datacenter-gpu-manager-4-core-{fake_repos.DCGM_VERSION}-1"}
    ladder.check("verify/the pinned driver, its kernel headers, dkms, CUDA, NCCL, fabric manager, rdma-core and DCGM are installed",
                 wanted <= packages, f"missing: {sorted(wanted - packages)}")
    ladder.check("verify/no package of the other flavour or the newer release, nor DCGM 3 (datacenter-gpu-manager)",
                 not any(p.startswith(("kmod-nvidia-latest-dkms", "datacenter-gpu-manager-3")) or new in p for p in packages),
                 sorted(packages))
    modules = lib.built_modules(root, IMAGE_KERNEL)
    ladder.check(f"verify/the image has nvidia.ko {old} (open) for its own kernel {IMAGE_KERNEL} (modinfo)",
                 modules == [f"{old} Dual MIT/GPL"], str(modules))
    ladder.check("verify/module stream nvidia-driver:570-open is enabled", lib.module_stream(root) == "570-open", lib.module_stream(root))
    lock = lib.lock_block(root)
    kernel_set = {f"{name}-0:{fake_repos.KERNEL}.*" for name in
                  ("kernel", "kernel-core", "kernel-modules", "kernel-modules-core", "kernel-modules-extra", "kernel-devel",
                   "kernel-devel-matched", "kernel-headers", "kernel-tools", "kernel-tools-libs")}
    ladder.check("verify/versionlock holds the driver packages and the running kernel's whole set",
                 {f"nvidia-driver-cuda-3:{driver}.*", f"kmod-nvidia-open-dkms-3:{driver}.*", f"nvidia-fabric-manager-3:{driver}.*"}
                 | kernel_set <= set(lock), lock)
    ladder.check("verify/versionlock leaves nvidia-container-toolkit and libnvidia-container alone",
                 not any("container" in entry for entry in lock), lock)
    unlocked = lib.dnf_upgrade_plan(image, image["plugins_off"])
    locked = lib.dnf_upgrade_plan(image, image["plugins_image"])
    ladder.check("verify/without the lock, dnf upgrade would move the driver to the newer release", f"3:{new}-1.el9" in unlocked, lib.tail(unlocked))
    ladder.check("verify/with the image's lock, dnf upgrade moves only nvidia-container-toolkit (security fixes), "
                 "not the driver or the kernel",
                 re.search(rf"nvidia-container-toolkit\s+x86_64\s+{re.escape(toolkit_new)}-1\s", locked) is not None, lib.tail(locked, 25))
    ladder.check("verify/with the image's lock, neither the newer driver nor the newer kernel is offered",
                 new not in locked and fake_repos.NEWER_KERNEL not in locked, lib.tail(locked, 25))
    newer_nccl = "-".join(fake_repos.NEWER_NCCL)
    ladder.check("verify/without the lock, dnf upgrade would bring libnccl built for a newer CUDA; with it, not",
                 newer_nccl in unlocked and newer_nccl not in locked
                 and f"libnccl-0:{fake_repos.NCCL_VERSION}-{fake_repos.NCCL_RELEASE}.*" in lib.lock_block(root, "nccl"),
                 f"{lib.tail(unlocked, 12)}\nnccl lock: {lib.lock_block(root, 'nccl')}")
    files = {
        "etc/slurm/gres.conf": "Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-23",
        "etc/slurm/cgroup.conf": "ConstrainDevices=yes",
        "etc/modprobe.d/blacklist-nouveau.conf": "blacklist nouveau",
        "etc/modules-load.d/nvidia-peermem.conf": "nvidia-peermem",
        "etc/profile.d/cuda.sh": "CUDA_HOME=/usr/local/cuda-12.8",
        "etc/yum.repos.d/hpc-train-gpu.repo": f"baseurl=file://{repos}/cuda/",
        "etc/firewalld/zones/hpc-train-fabric.xml": '<source address="10.10.0.0/16"/>',
        "usr/libexec/hpc-train/gpu-health-check": "fallback_gpus=8",
    }
    for path, line in files.items():
        text = (root / path).read_text() if (root / path).exists() else ""
        ladder.check(f"verify/{path}", line in text.splitlines() or line in text, text or "missing")
    links = {"usr/local/cuda": "/usr/local/cuda-12.8",
             "etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service": "/usr/lib/systemd/system/nvidia-persistenced.service",
             "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service": "/usr/lib/systemd/system/nvidia-fabricmanager.service",
             "etc/systemd/system/multi-user.target.wants/nvidia-dcgm.service": "/usr/lib/systemd/system/nvidia-dcgm.service"}
    for path, target in links.items():
        link = root / path
        ladder.check(f"verify/{path} -> {target} (and the target is in the image)",
                     link.is_symlink() and os.readlink(link) == target and (root / target.lstrip("/")).exists(),
                     os.readlink(link) if link.is_symlink() else "not a symlink")

    before = lib.rpm_packages(root)
    result, records = converge_run(venv, image, repos, "3-flavour-switch-refused", "--tags", "driver",
                                   "-e", "gpu_stack_driver_flavor=proprietary")
    failure = lib.first_failure(records, "el9-image") or {}
    wanted_msg = (f"nvidia_driver: el9-image has driver {old} (open); the inventory asks for {old} (proprietary). A driver change is "
                  "refused unless you pass -e nvidia_driver_allow_change=true: the node is then drained in Slurm and its jobs waited "
                  "for, and it reboots only with -e nvidia_driver_reboot=true.")
    ladder.check("negative/flavour switch on an installed driver: refused with the exact message", failure.get("msg", "") == wanted_msg,
                 f"wanted: {wanted_msg}\ngot:    {failure.get('msg', '')}")
    ladder.check("negative/refused flavour switch: packages, stream and lock untouched",
                 lib.rpm_packages(root) == before and lib.module_stream(root) == "570-open" and lib.lock_block(root) == lock)

    # The fallback for dnf without `module switch-to` (reset, enable, distro-sync), forced here; the live rung's
    # rollback takes the switch-to path. Only the driver changes, so only the driver role runs (the full playbook's
    # idempotence is run 2's, preflight's refusals are the check and missing_branch rungs').
    result, records = converge_run(venv, image, repos, "4-flavour-switch-allowed", "--tags", "driver",
                                   "-e", "gpu_stack_driver_flavor=proprietary",
                                   "-e", "nvidia_driver_allow_change=true", "-e", "nvidia_driver_stream_switch=distro-sync")
    packages = lib.rpm_packages(root)
    ladder.check("change/allowed flavour switch (reset, enable, distro-sync) succeeds", result.returncode == 0, lib.tail(result.stdout, 25))
    ladder.check("change/only the proprietary kernel module is installed, at the pinned version",
                 f"kmod-nvidia-latest-dkms-{driver}" in packages and not any(p.startswith("kmod-nvidia-open-dkms") for p in packages),
                 sorted(p for p in packages if "nvidia" in p))
    ladder.check("change/module stream switched to 570-dkms", lib.module_stream(root) == "570-dkms", lib.module_stream(root))
    modules = lib.built_modules(root, IMAGE_KERNEL)
    ladder.check("change/the image's kernel has the proprietary nvidia.ko now (the open one went with its package)",
                 modules == [f"{old} NVIDIA"], str(modules))
    new_lock = lib.lock_block(root)
    ladder.check("change/the lock follows the new kernel module",
                 f"kmod-nvidia-latest-dkms-3:{driver}.*" in new_lock and not any("open-dkms" in e for e in new_lock), new_lock)
    result, records = converge_run(venv, image, repos, "5-after-switch", "--tags", "driver",
                                   "-e", "gpu_stack_driver_flavor=proprietary", "-e", "nvidia_driver_allow_change=true")
    ladder.check("change/rerun after the switch changes nothing", result.returncode == 0 and lib.counts(records)[0] == 0,
                 "changed: " + ", ".join(r["task"] for r in records if r["changed"]))


def missing_branch(ladder, venv: Path) -> None:
    """Refusals on a fresh image root (independent of the converge rung): nothing may be installed."""
    repos = lib.ensure_repos("repos")
    fresh = lib.make_image_root("image-fresh", repos)
    result, records = converge_run(venv, fresh, repos, "missing-kernel-devel", "-e", f"image_build_kernel_version={MISSING_KERNEL}")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("negative/kernel-devel for the target kernel missing from the mirror: refused with a clear message",
                 result.returncode != 0 and failure.get("msg", "").startswith(
                     f"gpu_preflight: kernel-devel-{MISSING_KERNEL} (for kernel {MISSING_KERNEL}, the one the driver is built for) "
                     "is not in any enabled repository, so DKMS cannot build the NVIDIA module.")
                 and f"No package kernel-devel-{MISSING_KERNEL} available" in failure.get("msg", ""), failure.get("msg", ""))
    ladder.check("negative/missing kernel-devel: nothing changed", lib.counts(records)[0] == 0
                 and lib.rpm_packages(fresh["root"]) == {"bash-5.1.8-9.el9", "grubby-8.40-64.el9", f"kernel-core-{fake_repos.KERNEL}"},
                 str(sorted(lib.rpm_packages(fresh["root"]))))

    result, records = converge_run(venv, fresh, repos, "missing-branch", "-e", "gpu_stack_driver_branch=580",
                                   "-e", "gpu_stack_driver_version=")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("negative/driver branch missing from the mirror: refused with a clear message",
                 failure.get("msg", "").startswith(
                     "nvidia_driver: the repositories have no nvidia-driver:580-open module stream, so driver branch 580 (open) "
                     "cannot be installed.") and "nvidia-driver:580-open" in failure.get("msg", "").split("dnf said:")[-1],
                 failure.get("msg", ""))
    ladder.check("negative/missing branch: no driver package installed",
                 not any(p.startswith(("nvidia-", "kmod-nvidia")) for p in lib.rpm_packages(fresh["root"])))


def nccl_pin_change(ladder, venv: Path) -> None:
    """A pin change of NCCL (a new CUDA brings a new build) on a node whose dnf honours the versionlock list, as a live
    node's does: the lock of the old pin must not hide the new build, and the lock follows the pin."""
    repos = lib.ensure_repos("repos")
    node = lib.make_image_root("nccl-pin", repos, lock_active=True)
    # The CUDA repository as the driver role configures it (only the nccl role runs here).
    (node["root"] / "etc" / "yum.repos.d" / "cuda.repo").write_text(
        f"[cuda]\nname=CUDA (fake)\nbaseurl=file://{repos}/cuda/\nenabled=1\ngpgcheck=0\n")
    # The lock list as python3-dnf-plugin-versionlock ships it on a live node: there, empty.
    (node["root"] / "etc" / "dnf" / "plugins").mkdir(parents=True, exist_ok=True)
    (node["root"] / "etc" / "dnf" / "plugins" / "versionlock.list").write_text("")
    pins = ["--tags", "nccl", "-e", "gpu_stack_nccl_enabled=true"]
    result, records = converge_run(venv, node, repos, "nccl-1-pinned", *pins)
    old = f"libnccl-{fake_repos.NCCL_VERSION}-{fake_repos.NCCL_RELEASE}"
    ladder.check("nccl/installed at its pin and locked there", result.returncode == 0 and old in lib.rpm_packages(node["root"])
                 and f"libnccl-0:{fake_repos.NCCL_VERSION}-{fake_repos.NCCL_RELEASE}.*" in lib.lock_block(node["root"], "nccl"),
                 lib.tail(result.stdout, 12))
    version, release = fake_repos.NEWER_NCCL
    cuda = release.split("+cuda")[1]
    result, records = converge_run(venv, node, repos, "nccl-2-pin-changed", *pins, "-e", f"gpu_stack_nccl_version={version}-1",
                                   "-e", f"nccl_cuda_version={cuda}")
    packages = lib.rpm_packages(node["root"])
    ladder.check("nccl/a new pin (NCCL for a newer CUDA) installs past the old pin's lock, and the lock follows it",
                 result.returncode == 0 and f"libnccl-{version}-{release}" in packages and old not in packages
                 and lib.lock_block(node["root"], "nccl") == [f"libnccl-0:{version}-{release}.*", f"libnccl-devel-0:{version}-{release}.*"],
                 f"rc={result.returncode} lock={lib.lock_block(node['root'], 'nccl')}\n"
                 f"{(lib.first_failure(records, 'el9-image') or {}).get('msg', '')}\n{lib.tail(result.stdout, 12)}")
