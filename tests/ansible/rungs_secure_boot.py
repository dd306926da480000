"""The secure_boot rung (issue 29, item 9): the signed path for a node with Secure Boot on. gpu_nodes.yml
--tags preflight,driver in live-node mode (as live_change runs it) against its own copy of the converged root, with
the Secure Boot stand-ins of fake_secure_boot/: the real openssl and the kernel's real sign-file inside the root, the
dkms stand-in signing as dkms 3.x does, a mokutil stand-in over an enrolled and a pending list, and a fake reboot that
loads the module only if its signature verifies (openssl cms) against an enrolled certificate.

In order: a certificate that is not enrolled, one whose enrolment is pending, and a key that is not the certificate's
are refused before anything changes; then a node whose module DKMS built and signed with its own (unenrolled) key is
provisioned with the site's enrolled key pair and rebooted: the module must load after the reboot. On the roles before
this path (`warn`, the only way through) it does not, and the node stays drained."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import ladder_lib as lib
from fake_repos import build as fake_repos
from fake_secure_boot import secure_boot
from rungs_live import loaded_line, resumed, updates
from rungs_packages import IMAGE_KERNEL

KEYS_ON_NODE = "/etc/pki/hpc-train-mok"  # where the site keeps its key pair on the node (inside the root)
DKMS_CONF = "etc/dkms/framework.conf.d/hpc-train-mok.conf"


def secure_boot_rung(ladder, venv: Path) -> None:
    repos = lib.ensure_repos("repos")
    source = lib.WORK / "image" / "root"
    if not ladder.check("secure_boot/an installed root from the converge rung exists", (source / "var").exists()):
        return
    root = lib.make_image_root("secure-boot", repos, copy_from=source, lock_active=True)
    node = Node(root, venv, repos)
    refused_before_any_change(ladder, node)
    signed_module_loads(ladder, node)


class Node:
    """A live test node with Secure Boot on: its root, machine files, the site's keys, and one playbook run per call."""

    def __init__(self, paths: dict, venv: Path, repos: Path) -> None:
        self.root, self.conf, self.venv, self.repos = paths["root"], paths["conf"], venv, repos
        lib.set_running_kernel(self.root, IMAGE_KERNEL)
        self.machine = lib.WORK / "secure-boot-machine"
        shutil.rmtree(self.machine, ignore_errors=True)
        lib.build_fixture_machine({**json.loads((lib.HERE / "fixtures" / "facts" / "el9.json").read_text()), "secure_boot": True},
                                  self.machine)
        self.version = fake_repos.DRIVER_VERSIONS[0]
        self.loaded = self.machine / "proc-driver-nvidia-version"
        self.loaded.write_text(loaded_line(self.version, "proprietary"))  # the converged image ends on the proprietary flavour
        self.boot_id = self.machine / "boot_id"
        self.boot_id.write_text("first-boot\n")
        secure_boot.install_tools(self.root)
        keys = lib.WORK / "secure-boot-keys"
        shutil.rmtree(keys, ignore_errors=True)
        made = {name: secure_boot.make_key_pair(keys, name) for name in ("site", "stranger", "pending")}
        on_node = self.root / KEYS_ON_NODE.lstrip("/")
        on_node.mkdir(parents=True, exist_ok=True)
        for key, certificate in made.values():
            for path in (key, certificate):
                shutil.copy2(path, on_node / path.name)
        secure_boot.set_mok_state(self.root, True, enrolled=[made["site"][1]], pending=[made["pending"][1]])
        self.gpu_state = lib.write_state(lib.WORK / "secure-boot-gpu.json", {"loaded_version_file": str(self.loaded), "gpus": 8,
                                                                             "fabric": ["Completed", "Success"]})

    def play(self, label: str, key: str, certificate: str, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
        kernel = (self.root / "etc" / "hpc-train-stand-in" / "running-kernel").read_text().strip()
        slurm_state = lib.write_state(lib.WORK / "secure-boot-slurm.json", {
            "calls": [], "jobs": [], "polls_until_done": 0, "units": {}, "node": {"name": "gpu01", "state": "IDLE", "reason": ""},
            "config": {"ReturnToService": "2", "ResumeTimeout": "900 sec"},
            "machine": {"root": str(self.root), "kernel": kernel, "loaded_version_file": str(self.loaded),
                        "boot_id_file": str(self.boot_id), "module_loads": True}})
        record = lib.WORK / f"secure-boot-{label}.jsonl"
        env = lib.with_stand_ins(lib.ansible_env(self.venv, record, HPC_TRAIN_FAKE_SLURM=str(slurm_state),
                                                 HPC_TRAIN_FAKE_GPU=str(self.gpu_state)), "fake_slurm", "fake_gpu")
        result = lib.run([str(self.venv / "bin" / "ansible-playbook"), "-i", str(lib.EXAMPLE),
                          "-i", str(lib.HERE / "inventories" / "converge" / "hosts.yml"), "--limit", "el9-image",
                          "--tags", "preflight,driver", "-e", f"fixtures_dir={lib.HERE / 'fixtures'}", "-e", f"fake_repos={self.repos}",
                          "-e", f"gpu_stack_sysroot={self.root}", "-e", f"gpu_stack_dnf_conf_file={self.conf}",
                          "-e", "gpu_stack_releasever=9", "-e", "gpu_stack_manage_services=false",
                          "-e", f"gpu_preflight_pci_devices_path={self.machine}/sys/bus/pci/devices",
                          "-e", f"gpu_preflight_efivars_path={self.machine}/sys/firmware/efi/efivars",
                          "-e", f"nvidia_driver_loaded_version_file={self.loaded}", "-e", f"nvidia_driver_boot_id_file={self.boot_id}",
                          "-e", json.dumps({"fixture_fact_overrides": {"kernel": kernel}, "gpu_nodes_rollout_batches": ["100%"]}),
                          "-e", "gpu_stack_driver_flavor=proprietary", "-e", "nvidia_driver_drain_poll_s=1",
                          "-e", "nvidia_driver_expected_gpus=8",
                          "-e", f"nvidia_driver_mok_signing_key={KEYS_ON_NODE}/{key}",
                          "-e", f"nvidia_driver_mok_certificate={KEYS_ON_NODE}/{certificate}", *extra, "live_change.yml"],
                         env, lib.WORK / "logs" / f"secure-boot-{label}.log")
        return result, lib.read_records(record), json.loads(slurm_state.read_text())

    def state(self) -> tuple:
        """What a refusal must leave alone: packages, the versionlock block, DKMS's configuration, the built modules."""
        modules = {str(m): m.read_bytes() for m in sorted(self.root.glob("lib/modules/*/extra/nvidia.ko*"))}
        return (lib.rpm_packages(self.root), lib.lock_block(self.root), (self.root / DKMS_CONF).exists(), modules)

    def signer(self, kernel: str) -> list[str]:
        modules = sorted((self.root / "lib" / "modules" / kernel).rglob("nvidia.ko*"))
        return [subprocess.run(["modinfo", "-F", "signer", str(m)], capture_output=True, text=True).stdout.strip() for m in modules]


def refused_before_any_change(ladder, node: Node) -> None:
    """Each refusal comes from gpu_preflight, before the drain, the packages or DKMS's configuration."""
    cases = [("1-not-enrolled", "stranger.key", "stranger.der",
              f"gpu_preflight: {KEYS_ON_NODE}/stranger.der is not an enrolled Machine Owner Key on el9-image (mokutil --test-key: "
              f"{KEYS_ON_NODE}/stranger.der is not enrolled); run mokutil --import {KEYS_ON_NODE}/stranger.der, reboot and "
              "confirm it at MokManager on the console, then rerun. Nothing was changed."),
             ("2-pending", "pending.key", "pending.der",
              f"gpu_preflight: {KEYS_ON_NODE}/pending.der is not an enrolled Machine Owner Key on el9-image (mokutil --test-key: "
              f"{KEYS_ON_NODE}/pending.der is already in the enrollment request); its enrolment is pending: reboot the node and "
              "confirm it at MokManager on the console (Enroll MOK, Continue, Yes, the password given to mokutil --import), "
              "then rerun. Nothing was changed."),
             ("3-key-not-the-certificates", "stranger.key", "site.der",
              f"gpu_preflight: {KEYS_ON_NODE}/stranger.key is not the private key of {KEYS_ON_NODE}/site.der on el9-image; DKMS "
              "would sign modules the kernel refuses. Set the key pair whose certificate is enrolled. Nothing was changed.")]
    for label, key, certificate, expected in cases:
        before = node.state()
        result, records, slurm = node.play(label, key, certificate)
        failure = lib.first_failure(records, "el9-image") or {}
        ladder.check(f"secure_boot/{label}: refused with the fix, before the drain, the packages or DKMS's configuration",
                     failure.get("msg", "") == expected and updates(slurm) == [] and node.state() == before,
                     f"{failure.get('msg', '')}\nupdates={updates(slurm)} state {before} -> {node.state()}")


def signed_module_loads(ladder, node: Node) -> None:
    """The driver was just installed and not loaded yet; its module for the boot kernel was built (NVIDIA's %post,
    before the site set its key pair) and signed by DKMS with its own generated key. With the site's enrolled key pair the roles rebuild it signed by that key, and the node
    reboots into a driver that loads."""
    for built in node.root.glob(f"var/lib/dkms/*/*/{IMAGE_KERNEL}"):
        shutil.rmtree(built)
    for module in node.root.glob(f"lib/modules/{IMAGE_KERNEL}/extra/nvidia.ko*"):
        module.unlink()
    dkms = subprocess.run(["chroot", str(node.root), "dkms", "autoinstall", "-k", IMAGE_KERNEL], capture_output=True, text=True)
    ladder.check("secure_boot/the dkms stand-in signs with its own generated key when none is configured (as dkms 3.x does)",
                 dkms.returncode == 0 and node.signer(IMAGE_KERNEL) == ["DKMS module signing key"]
                 and (node.root / "var/lib/dkms/mok.key").exists(), f"rc={dkms.returncode} {dkms.stdout}{dkms.stderr} "
                 f"signers={node.signer(IMAGE_KERNEL)}")
    node.loaded.unlink()  # the driver was just installed: nothing loaded yet, so the run reboots into it
    # The default policy (fail): a site with an enrolled key pair goes through without `warn`.
    result, records, slurm = node.play("4-site-key-reboot", "site.key", "site.der",
                                       "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm")
    conf = node.root / DKMS_CONF
    ladder.check("secure_boot/DKMS is pointed at the site's key pair (framework.conf.d)",
                 conf.exists() and f'mok_signing_key="{KEYS_ON_NODE}/site.key"' in conf.read_text()
                 and f'mok_certificate="{KEYS_ON_NODE}/site.der"' in conf.read_text(),
                 conf.read_text() if conf.exists() else "missing")
    ladder.check("secure_boot/the module for the boot kernel is signed by the site's key (real modinfo)",
                 node.signer(IMAGE_KERNEL) == ["site module signing key"], str(node.signer(IMAGE_KERNEL)))
    loaded = node.loaded.read_text() if node.loaded.exists() else ""
    ladder.check("secure_boot/the module loads after the reboot (its signature verifies against the enrolled certificate) "
                 "and the node is resumed",
                 result.returncode == 0 and f"Kernel Module  {node.version}" in loaded and len(resumed(slurm)) == 1
                 and slurm["node"] == {"name": "gpu01", "state": "IDLE", "reason": ""},
                 f"rc={result.returncode} loaded={loaded!r} node={slurm['node']}\n{lib.tail(result.stdout, 12)}")
