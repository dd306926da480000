"""The live_change rung: the driver lifecycle on a running node. gpu_nodes.yml --tags driver in live-node
mode against a copy of the converged image root, with the Slurm CLI and the node's systemd (fake_slurm/), nvidia-smi
and libcuda (fake_gpu/) as recording stand-ins, grubby as a stand-in inside the root, and the "running kernel", the
boot id and the "loaded driver" as files the stand-ins read and, on a reboot, write.

Each scenario continues from the node the previous one left, like an admin's successive runs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import ladder_lib as lib
from fake_gpu import libcuda_elf
from fake_repos import build as fake_repos
from rungs_packages import IMAGE_KERNEL

NEWER_KERNEL = fake_repos.NEWER_KERNEL + ".x86_64"


def loaded_line(version: str, flavor: str) -> str:
    kind = "Open Kernel Module for x86_64" if flavor == "open" else "x86_64 Kernel Module"
    return f"NVRM version: NVIDIA UNIX {kind}  {version}  Release Build  (stand-in)\n"


def live_change(ladder, venv: Path) -> None:
    repos = lib.ensure_repos("repos")  # the converged root's repository file points there
    source = lib.WORK / "image" / "root"
    if not ladder.check("live/an installed root from the converge rung exists", (source / "var").exists()):
        return
    node = lib.make_image_root("live", repos, copy_from=source, lock_active=True)
    root = node["root"]
    lib.set_running_kernel(root, IMAGE_KERNEL)
    machine = lib.WORK / "live-machine"
    shutil.rmtree(machine, ignore_errors=True)
    lib.build_fixture_machine(json.loads((lib.HERE / "fixtures" / "facts" / "el9.json").read_text()), machine)
    loaded = machine / "proc-driver-nvidia-version"
    old = fake_repos.DRIVER_VERSIONS[0]
    driver = f"{old}-1.el9"
    loaded.write_text(loaded_line(old, "proprietary"))  # the converged image ends on the proprietary flavour
    gpu_state = lib.write_state(lib.WORK / "live-gpu.json", {"loaded_version_file": str(loaded), "gpus": 8,
                                                              "fabric": ["Completed", "Success"]})
    slurm_state = lib.WORK / "live-slurm.json"

    # Scenarios run only the driver role (preflight's checks are the check rung's), with the GPU count preflight would
    # find (8 on the fixture's PCI bus); the kernel updates also run preflight (its dry run past the old lock). The node
    # runs the kernel of the root's running-kernel file (a fake reboot boots GRUB's default and writes it there).
    boot_id = machine / "boot_id"
    boot_id.write_text("first-boot\n")

    def play(label: str, slurm: dict, *extra: str, tags: str = "driver", limit: str = "el9-image", module_loads: bool = True,
             units: dict | None = None) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
        kernel = (root / "etc" / "hpc-train-stand-in" / "running-kernel").read_text().strip()
        # stackhpc's openhpc role's ReturnToService=2, and a ResumeTimeout longer than a boot (gpu_preflight refuses a
        # Slurm reboot under a shorter one; the check rung shows that).
        lib.write_state(slurm_state, {"calls": [], "jobs": [], "polls_until_done": 0, "units": units or {},
                                      "config": {"ReturnToService": "2", "ResumeTimeout": "900 sec"}, **slurm,
                                      "machine": {"root": str(root), "kernel": kernel, "loaded_version_file": str(loaded),
                                                  "boot_id_file": str(boot_id), "module_loads": module_loads}})
        record = lib.WORK / f"live-{label}.jsonl"
        env = lib.with_stand_ins(lib.ansible_env(venv, record, HPC_TRAIN_FAKE_SLURM=str(slurm_state), HPC_TRAIN_FAKE_GPU=str(gpu_state)),
                                 "fake_slurm", "fake_gpu")
        result = lib.run([str(venv / "bin" / "ansible-playbook"), "-i", str(lib.EXAMPLE), "-i", str(lib.HERE / "inventories" / "converge" / "hosts.yml"),
                          "--limit", limit, "--tags", tags, "-e", f"fixtures_dir={lib.HERE / 'fixtures'}",
                          "-e", f"fake_repos={repos}", "-e", f"gpu_stack_sysroot={root}", "-e", f"gpu_stack_dnf_conf_file={node['conf']}",
                          "-e", "gpu_stack_releasever=9", "-e", "gpu_stack_manage_services=false",
                          "-e", f"gpu_preflight_pci_devices_path={machine}/sys/bus/pci/devices",
                          "-e", f"gpu_preflight_efivars_path={machine}/sys/firmware/efi/efivars",
                          "-e", f"nvidia_driver_loaded_version_file={loaded}", "-e", f"nvidia_driver_boot_id_file={boot_id}",
                          "-e", json.dumps({"fixture_fact_overrides": {"kernel": kernel}}),
                          "-e", "nvidia_driver_allow_change=true", "-e", "nvidia_driver_drain_poll_s=1", "-e", "nvidia_driver_expected_gpus=8",
                          *(["-e", '{"gpu_nodes_rollout_batches": ["100%"]}'] if "," not in limit else []), *extra, "live_change.yml"],
                         env, lib.WORK / "logs" / f"live-{label}.log")
        return result, lib.read_records(record), json.loads(slurm_state.read_text())

    live = SimpleNamespace(play=play, root=root, loaded=loaded, gpu_state=gpu_state, repos=repos, old=old, driver=driver,
                           rollback=fake_repos.ROLLBACK_VERSION, updates=updates, call_times=call_times, resumed=resumed)
    drain_and_change(ladder, live)
    rollback_to_550(ladder, live)
    slurm = boot_kernel(ladder, live)
    fabric_and_rollout(ladder, live, slurm)


def drain_and_change(ladder, node) -> None:
    """Jobs that outlast the drain; the change after the drain; a rerun that reboots; then an admin's drain and an
    unknown NodeName."""
    play, root, loaded, old, driver = node.play, node.root, node.loaded, node.old, node.driver
    call_times, resumed = node.call_times, node.resumed
    # 1. Jobs outlast the drain timeout: nothing changes, and the drain this run set is undone (issue 29: a busy batch
    #    left drained would take it out of service while the rollout stops).
    before = lib.rpm_packages(root)
    busy = {"node": {"name": "gpu01", "state": "MIXED", "reason": ""}, "jobs": ["4242"]}
    result, records, slurm = play("1-jobs-outlast-the-timeout", {**busy, "polls_until_done": None},
                                  "-e", "gpu_stack_driver_flavor=open", "-e", "nvidia_driver_drain_timeout_s=2")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/jobs outlast the drain timeout: stopped with a clear message that says the node is back in service",
                 failure.get("msg", "") == "nvidia_driver: jobs 4242 still run on gpu01 after 2 s; nothing was changed and the drain "
                 "this run set was undone: gpu01 is back in service as it was. Rerun when they have ended (or raise "
                 "nvidia_driver_drain_timeout_s).", failure.get("msg", ""))
    drains = [c["time"] for c in updates_of(slurm) if "State=DRAIN" in c["argv"]]
    ladder.check("live/jobs outlast the timeout: drained, then resumed (no node left drained by us), packages untouched",
                 (slurm["node"]["state"], slurm["node"]["reason"]) == ("MIXED", "") and len(drains) == 1
                 and len(resumed(slurm)) == 1 and drains[0] < resumed(slurm)[0] and lib.rpm_packages(root) == before,
                 json.dumps(slurm["node"]) + f" updates={[c['argv'][2:] for c in updates_of(slurm)]}")
    # 1b. The same on a node an admin had drained: never resumed, and the message says it was left as it was.
    admin = {"node": {"name": "gpu01", "state": "MIXED+DRAIN", "reason": "bad fan"}, "jobs": ["4242"], "polls_until_done": None}
    result, records, slurm = play("1b-admin-drain-outlasts-the-timeout", admin,
                                  "-e", "gpu_stack_driver_flavor=open", "-e", "nvidia_driver_drain_timeout_s=2")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/jobs outlast the timeout on a node an admin drained: left drained with the admin's reason, and said so",
                 failure.get("msg", "") == "nvidia_driver: jobs 4242 still run on gpu01 after 2 s; nothing was changed and gpu01 is "
                 'left as it was before this run, out of service (reason "bad fan"). Rerun when they have ended (or raise '
                 "nvidia_driver_drain_timeout_s)." and updates_of(slurm) == []
                 and (slurm["node"]["state"], slurm["node"]["reason"]) == ("MIXED+DRAIN", "bad fan"),
                 f"{failure.get('msg', '')}\n{json.dumps(slurm['node'])} updates={[c['argv'][2:] for c in updates_of(slurm)]}")

    # 2. The change once the jobs have ended; a reboot over a local connection is refused.
    result, records, slurm = play("2-drain-then-change", {**busy, "polls_until_done": 2},
                                  "-e", "gpu_stack_driver_flavor=open", "-e", "nvidia_driver_drain_timeout_s=60",
                                  "-e", "nvidia_driver_reboot=true")
    packages = lib.rpm_packages(root)
    ladder.check("live/the driver changed once the jobs had ended",
                 f"kmod-nvidia-open-dkms-{driver}" in packages and not any(p.startswith("kmod-nvidia-latest") for p in packages),
                 lib.tail(result.stdout, 20))
    polls = call_times(slurm, "squeue")
    drained = [c["time"] for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "update"] and "State=DRAIN" in c["argv"]]
    query = subprocess.run(["rpm", "--root", str(root), "-q", "--queryformat", "%{INSTALLTIME}", "kmod-nvidia-open-dkms"],
                           capture_output=True, text=True)
    installed = int(query.stdout) if query.returncode == 0 else 0
    ladder.check("live/order: drain, then polls until no job is left, then the package change",
                 len(drained) == 1 and len(polls) == 2 and drained[0] < polls[0] and installed >= int(polls[-1]),
                 f"drain={drained} polls={polls} kmod installed at {installed}")
    ladder.check("live/the kmod's own %post built the open module for the running kernel",
                 lib.built_modules(root, IMAGE_KERNEL) == [f"{old} Dual MIT/GPL"], str(lib.built_modules(root, IMAGE_KERNEL)))
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/reboot asked over a local connection: refused, node not resumed",
                 failure.get("msg", "") == "nvidia_driver: el9-image is reached over a local connection; rebooting it would reboot the controller."
                 and not resumed(slurm) and slurm["node"]["state"].endswith("DRAIN"),
                 f"{failure.get('msg', '')}\n{json.dumps(slurm['node'])}")

    # 3. A rerun with a reboot allowed (through Slurm, as a node-local run can): it reboots although this run changes
    #    no package, the node comes back with the driver loaded, which is checked before the node is resumed.
    result, records, slurm = play("3-rerun-reboots", {"node": slurm["node"]}, "-e", "gpu_stack_driver_flavor=open",
                                  "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm")
    reboots = [c for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "reboot"]]
    hold = [c for c in updates_of(slurm) if c["argv"][3:] == ["State=DRAIN", f"Reason=hpc-train: reboot into NVIDIA driver {old}"]]
    ladder.check("live/rerun with a reboot allowed: held with a DRAIN and the reboot's reason, then Slurm reboots the node once "
                 "(scontrol reboot, no nextstate)",
                 result.returncode == 0 and [c["argv"] for c in reboots] == [["scontrol", "reboot", "gpu01"]]
                 and len(hold) == 1 and hold[0]["time"] < reboots[0]["time"],
                 f"rc={result.returncode} reboots={reboots} hold={hold}\n{lib.tail(result.stdout, 15)}")
    installed = root / "etc" / "hpc-train" / "nvidia-driver-installed"
    ladder.check("live/the installed driver is recorded for the gpu_health check in the node's own batch",
                 installed.exists() and installed.read_text() == f"{old}\n", installed.read_text() if installed.exists() else "missing")
    unchecked = in_service_between(slurm, reboots[0]["time"] if reboots else 0, (resumed(slurm) or [float("inf")])[0])
    ladder.check("live/ReturnToService=2: the rebooted node is back drained, never in service before its driver is checked",
                 reboots and unchecked == [], f"in service unchecked: {unchecked}; history={slurm.get('history')}")
    ladder.check("live/after the reboot the driver is checked (nvidia-smi) and only then the node resumed",
                 len(resumed(slurm)) == 1 and reboots and resumed(slurm)[0] > reboots[0]["time"]
                 and slurm["node"] == {"name": "gpu01", "state": "IDLE", "reason": ""} and "Open Kernel Module" in loaded.read_text()
                 and any(r["task"].endswith("Check that every GPU runs the installed driver") and r["status"] == "ok" for r in records),
                 f"resume={resumed(slurm)} node={slurm['node']} loaded={loaded.read_text()!r}")

    admin_drain_and_unknown_node(ladder, node, slurm)


def admin_drain_and_unknown_node(ladder, node, slurm: dict) -> None:
    """A node an admin drained; a NodeName Slurm does not know, and the same node marked new."""
    play, root, old, driver, updates = node.play, node.root, node.old, node.driver, node.updates
    # 4. A node an admin drained: changed without touching its Slurm state; no reboot asked, so one is pending.
    result, records, slurm = play("4-admin-drained-node", {"node": {"name": "gpu01", "state": "IDLE+DRAIN", "reason": "bad fan"}},
                                  "-e", "gpu_stack_driver_flavor=proprietary")
    packages = lib.rpm_packages(root)
    ladder.check("live/a node an admin drained: changed without touching its Slurm state",
                 result.returncode == 0 and f"kmod-nvidia-latest-dkms-{driver}" in packages and updates(slurm) == []
                 and slurm["node"] == {"name": "gpu01", "state": "IDLE+DRAIN", "reason": "bad fan"},
                 f"rc={result.returncode} updates={updates(slurm)} node={slurm['node']}\n{lib.tail(result.stdout, 12)}")
    messages = [r["msg"] for r in records if r["task"].endswith("Report the reboot that is still needed")]
    ladder.check("live/no reboot asked: says a reboot is pending (loaded open, installed proprietary)",
                 any("it is loaded after a reboot" in m and "kernel runs " + old + " (open)" in m for m in messages), str(messages))

    # 5. Slurm does not know the node by its host name: refused before anything changes.
    before, stream, lock = lib.rpm_packages(root), lib.module_stream(root), lib.lock_block(root)
    renamed = {"name": "gpu-a01", "state": "IDLE", "reason": ""}
    result, records, slurm = play("5-unknown-nodename", {"node": renamed}, "-e", "gpu_stack_driver_flavor=open")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/a NodeName Slurm does not know: refused with a message that names the fix",
                 failure.get("msg", "").startswith("nvidia_driver: Slurm knows no node named gpu01 (scontrol: Node gpu01 not found)")
                 and "nvidia_driver_slurm_node_name" in failure.get("msg", "") and "nvidia_driver_slurm_new_node=true" in failure.get("msg", ""),
                 failure.get("msg", ""))
    ladder.check("live/unknown NodeName: no package, stream, lock or Slurm state changed",
                 lib.rpm_packages(root) == before and lib.module_stream(root) == stream and lib.lock_block(root) == lock
                 and updates(slurm) == [], f"updates={updates(slurm)}")

    # 5b. The same node marked as not in Slurm yet: the change goes ahead, Slurm is left alone.
    result, records, slurm = play("5b-new-node", {"node": renamed}, "-e", "gpu_stack_driver_flavor=open",
                                  "-e", "nvidia_driver_slurm_new_node=true")
    ladder.check("live/a node marked new (nvidia_driver_slurm_new_node): changed without any Slurm update",
                 result.returncode == 0 and f"kmod-nvidia-open-dkms-{driver}" in lib.rpm_packages(root) and updates(slurm) == [],
                 f"rc={result.returncode} updates={updates(slurm)}\n{lib.tail(result.stdout, 12)}")

    node.renamed = renamed


def rollback_to_550(ladder, node) -> None:
    """Roll back to an older branch on a node whose NodeName is mapped, first in check mode."""
    play, root, loaded, renamed, rollback, old = node.play, node.root, node.loaded, node.renamed, node.rollback, node.old
    updates, call_times, resumed = node.updates, node.call_times, node.resumed
    # 6. Roll back to an older branch (570 -> 550) on a node whose NodeName is mapped, with a job to wait for; first in
    #    check mode, which must change nothing. CUDA 12.4 here keeps this about the rollback (550 is built for it;
    #    preflight's table is checked in check mode).
    rollback_pins = ["-e", "gpu_stack_driver_branch=550", "-e", "gpu_stack_driver_version=", "-e", "gpu_stack_driver_flavor=open",
                     "-e", "gpu_stack_cuda_version=12.4", "-e", "gpu_stack_torch_cuda_tag=cu124", "-e", "gpu_stack_slurm_node_name=gpu-a01"]
    before, stream, lock, modules = lib.rpm_packages(root), lib.module_stream(root), lib.lock_block(root), lib.built_modules(root, IMAGE_KERNEL)
    result, records, slurm = play("6a-rollback-check-mode", {"node": {**renamed, "state": "MIXED"}, "jobs": ["77"], "polls_until_done": 1},
                                  *rollback_pins, "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm", "--check")
    ladder.check("live/rollback in check mode: runs, changes no package, stream, lock, module or Slurm state",
                 result.returncode == 0 and lib.rpm_packages(root) == before and lib.module_stream(root) == stream
                 and lib.lock_block(root) == lock and lib.built_modules(root, IMAGE_KERNEL) == modules and updates(slurm) == []
                 and not any(c["argv"][:2] == ["scontrol", "reboot"] for c in slurm["calls"]),
                 f"rc={result.returncode} updates={updates(slurm)}\n{lib.tail(result.stdout, 12)}")
    result, records, slurm = play("6-rollback-to-550", {"node": {**renamed, "state": "MIXED"}, "jobs": ["77"], "polls_until_done": 1},
                                  *rollback_pins, "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm")
    packages = lib.rpm_packages(root)
    driver_packages = sorted(p for p in packages if p.startswith(("nvidia-", "kmod-nvidia")) and "container" not in p)
    ladder.check("live/rollback 570 -> 550: every driver package is 550 now, no 570 package left (dnf module switch-to)",
                 result.returncode == 0 and driver_packages and all(f"-{rollback}-" in p for p in driver_packages)
                 and any(r["task"].startswith("nvidia_driver : Switch to nvidia-driver:550-open") and r["changed"] for r in records),
                 f"rc={result.returncode} {driver_packages}\n{lib.tail(result.stdout, 15)}")
    lock = lib.lock_block(root)
    ladder.check("live/rollback: stream 550-open, the lock and the module for the running kernel follow",
                 lib.module_stream(root) == "550-open" and f"kmod-nvidia-open-dkms-3:{rollback}-1.el9.*" in lock
                 and not any(old in entry for entry in lock) and lib.built_modules(root, IMAGE_KERNEL) == [f"{rollback} Dual MIT/GPL"],
                 f"stream={lib.module_stream(root)} lock={lock} modules={lib.built_modules(root, IMAGE_KERNEL)}")
    reboots = call_times(slurm, "scontrol", "reboot")
    drained = [c["time"] for c in slurm["calls"] if c["argv"][:3] == ["scontrol", "update", "NodeName=gpu-a01"] and "State=DRAIN" in c["argv"]]
    ladder.check("live/rollback: drained (mapped NodeName), held across the reboot, rebooted by Slurm, checked, resumed",
                 len(drained) == 2 and len(reboots) == 1 and len(resumed(slurm)) == 1 and drained[0] < reboots[0] < resumed(slurm)[0]
                 and slurm["node"] == {"name": "gpu-a01", "state": "IDLE", "reason": ""} and f"  {rollback}  " in loaded.read_text(),
                 f"drain={drained} reboot={reboots} resume={resumed(slurm)} node={slurm['node']}")

    node.pins = rollback_pins


def updates_of(slurm: dict) -> list[dict]:
    return [c for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "update"]]


def in_service_between(slurm: dict, start: float, end: float) -> list[dict]:
    """The node's states between two times in which Slurm could have started a job on it (neither DRAIN nor DOWN)."""
    return [h for h in slurm.get("history", []) if start <= h["time"] < end and not any(x in h["state"] for x in ("DRAIN", "DOWN"))]


def held_for_reboot(slurm: dict, version: str) -> bool:
    """Back from a reboot through Slurm still drained, with the reason this role gave the reboot."""
    return slurm["node"]["state"] == "IDLE+DRAIN" and slurm["node"]["reason"] == f"hpc-train: reboot into NVIDIA driver {version}"


def updates(slurm: dict) -> list[list[str]]:
    return [c["argv"] for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "update"]]

def call_times(slurm: dict, *prefix: str) -> list[float]:
    return [c["time"] for c in slurm["calls"] if c["argv"][:len(prefix)] == list(prefix)]

def resumed(slurm: dict) -> list[float]:
    return [c["time"] for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "update"] and "State=RESUME" in c["argv"]]


def boot_kernel(ladder, node) -> dict:
    """A kernel installed and made GRUB's default but not booted; the reboot into it; a driver that does not load."""
    play, root, loaded, gpu_state, repos, renamed, rollback_pins, rollback, old = (
        node.play, node.root, node.loaded, node.gpu_state, node.repos, node.renamed, node.pins, node.rollback, node.old)
    updates, call_times, resumed = node.updates, node.call_times, node.resumed
    # 7. A newer kernel is installed and, as on EL, made GRUB's default; the node has not rebooted and still runs the
    #    old driver. First with build_for_boot_kernel false: refused, nothing changed.
    lib.rpm_install(root, sorted((repos / "baseos").glob(f"kernel-core-{NEWER_KERNEL}.rpm")))
    loaded.write_text(loaded_line(old, "open"))
    before, lock = lib.rpm_packages(root), lib.lock_block(root)
    result, records, slurm = play("7a-boot-kernel-refused", {"node": {**renamed, "state": "IDLE"}}, *rollback_pins,
                                  "-e", "nvidia_driver_build_for_boot_kernel=false", tags="preflight,driver")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/a node that boots another kernel than it runs, with build_for_boot_kernel false: refused, naming the fix",
                 failure.get("msg", "").startswith(f"nvidia_driver: el9-image runs kernel {IMAGE_KERNEL} but boots {NEWER_KERNEL} next "
                                                   "(grubby --default-kernel).")
                 and f"grubby --set-default /boot/vmlinuz-{IMAGE_KERNEL}" in failure.get("msg", "")
                 and lib.rpm_packages(root) == before and lib.lock_block(root) == lock and updates(slurm) == [], failure.get("msg", ""))

    # 7b. The same run as a site makes it (build for the boot kernel), with a reboot allowed; the reboot boots GRUB's
    #     default, whose nvidia.ko fails to load: the node must not pass as rebooted.
    result, records, slurm = play("7b-boot-kernel-and-reboot", {"node": {**renamed, "state": "IDLE"}}, *rollback_pins,
                                  "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm",
                                  tags="preflight,driver", module_loads=False)
    lock = lib.lock_block(root)
    ladder.check("live/kernel installed, not booted: kernel-devel for the kernel the node boots next installed past the lock, lock moved to it",
                 f"kernel-devel-{fake_repos.NEWER_KERNEL}" in lib.rpm_packages(root)
                 and f"kernel-core-0:{fake_repos.NEWER_KERNEL}.*" in lock and not any(fake_repos.KERNEL in entry for entry in lock),
                 f"rc={result.returncode} lock={lock}\n{lib.tail(result.stdout, 12)}")
    ladder.check("live/kernel installed, not booted: the module is built for the kernel the node boots next before the reboot",
                 lib.built_modules(root, NEWER_KERNEL) == [f"{rollback} Dual MIT/GPL"] and len(call_times(slurm, "scontrol", "reboot")) == 1,
                 str(lib.built_modules(root, NEWER_KERNEL)))
    running = (root / "etc" / "hpc-train-stand-in" / "running-kernel").read_text().strip()
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/the reboot boots GRUB's default kernel (grubby stand-in)", running == NEWER_KERNEL, running)
    ladder.check("live/rebooted but the driver did not load: the host fails (the rollout stops), the node stays out of service",
                 result.returncode != 0 and failure.get("msg", "").startswith("nvidia_driver: el9-image rebooted but runs no NVIDIA driver, "
                                                                             f"not the installed driver {rollback} (open)")
                 and not resumed(slurm) and held_for_reboot(slurm, rollback), f"rc={result.returncode} {failure.get('msg', '')}\nnode={slurm['node']}")

    # 8. The reboot again, now the module loads, on an NVSwitch node whose fabric manager did not finish: not resumed.
    lib.write_state(gpu_state, {"loaded_version_file": str(loaded), "gpus": 8, "fabric": ["In Progress", "N/A"]})
    result, records, slurm = play("8-fabric-manager-failed", {"node": slurm["node"]}, *rollback_pins,
                                  "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/fabric manager not ready after the reboot: stopped with a clear message, node left drained",
                 failure.get("msg", "").startswith("nvidia_driver: the GPU fabric of el9-image is not ready")
                 and "error 802" in failure.get("msg", "") and len(call_times(slurm, "scontrol", "reboot")) == 1
                 and f"  {rollback}  " in loaded.read_text() and not resumed(slurm) and held_for_reboot(slurm, rollback),
                 f"{failure.get('msg', '')}\nnode={slurm['node']}")
    return slurm


def fabric_and_rollout(ladder, node, slurm: dict) -> None:
    """An HGX A100 with and without Fabric Manager, in service with busy GPUs; nvidia-persistenced and
    nvidia-fabricmanager started; then the rollout's stops."""
    play, root, loaded, gpu_state, rollback_pins = node.play, node.root, node.loaded, node.gpu_state, node.pins
    resumed = node.resumed
    # 9. An HGX A100: fabric.state is N/A on every GPU, Fabric Manager is required all the same. With it failed (CUDA
    #    says 802), the node stays out; running (a context on every GPU), it is resumed, and nvidia-persistenced
    #    (NVIDIA's unit has no [Install]) is linked and started.
    a100 = {"loaded_version_file": str(loaded), "gpus": 8, "fabric": ["N/A", "N/A"], "name": "NVIDIA A100-SXM4-80GB"}
    lib.write_state(gpu_state, a100)
    services = ["-e", "nvidia_driver_manage_services=true"]
    result, records, slurm = play("9a-a100-fabric-manager-down", {"node": slurm["node"]}, *rollback_pins, *services,
                                  "-e", f"nvidia_driver_libcuda={libcuda_elf.build(lib.WORK / 'libcuda-802' / 'libcuda.so.1', init_rc=802)}",
                                  units={"nvidia-fabricmanager.service": "failed"})
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/A100 HGX, fabric manager failed: not resumed, the message names the service and CUDA's 802",
                 "nvidia-fabricmanager: failed" in failure.get("msg", "") and "CUDA_ERROR_SYSTEM_NOT_READY (802)" in failure.get("msg", "")
                 and not resumed(slurm), failure.get("msg", "") or lib.tail(result.stdout))
    result, records, slurm = play("9b-a100-fabric-manager-running", {"node": slurm["node"]}, *rollback_pins, *services,
                                  "-e", f"nvidia_driver_libcuda={libcuda_elf.build(lib.WORK / 'libcuda-ok' / 'libcuda.so.1')}",
                                  # Linked by config.yml, not started by any boot yet: the role must start it.
                                  units={"nvidia-fabricmanager.service": "inactive"})
    ladder.check("live/A100 HGX, fabric manager running and a CUDA context on every GPU: resumed (fabric.state N/A is no failure)",
                 result.returncode == 0 and len(resumed(slurm)) == 1 and slurm["node"]["state"] == "IDLE",
                 f"rc={result.returncode} node={slurm['node']}\n{lib.tail(result.stdout, 12)}")
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "nvidia-persistenced.service"
    started = [c["time"] for c in slurm["calls"] if c["argv"][:2] == ["systemctl", "start"] and "nvidia-persistenced" in c["argv"][2]]
    ladder.check("live/nvidia-persistenced as NVIDIA packages it (no [Install]): linked into multi-user.target and started, before the resume",
                 wants.is_symlink() and slurm.get("units", {}).get("nvidia-persistenced.service") == "active"
                 and len(started) == 1 and resumed(slurm) and started[0] < resumed(slurm)[0],
                 f"link={wants.is_symlink()} units={slurm.get('units')} started={started}")
    started = [c["time"] for c in slurm["calls"] if c["argv"][:2] == ["systemctl", "start"] and "nvidia-fabricmanager" in c["argv"][2]]
    ladder.check("live/nvidia-fabricmanager (linked, not started by any boot yet) is started too, before the resume",
                 len(started) == 1 and resumed(slurm) and started[0] < resumed(slurm)[0], f"started={started}")

    # 9c. The same node in service, its GPUs busy (cuCtxCreate: 46, devices unavailable): a rerun must not probe it.
    busy = libcuda_elf.build(lib.WORK / "libcuda-busy" / "libcuda.so.1", ctx_rc=46)
    result, records, slurm = play("9c-a100-in-service", {"node": slurm["node"]}, *rollback_pins, *services, "--skip-tags", "packages",
                                  "-e", f"nvidia_driver_libcuda={busy}", units={"nvidia-fabricmanager.service": "active"})
    notes = [r["msg"] for r in records if r["task"].endswith("Say why the CUDA contexts were not checked")]
    ladder.check("live/A100 HGX in service, GPUs busy: a rerun tries no CUDA context on them, passes and says why",
                 result.returncode == 0 and slurm["node"]["state"] == "IDLE" and len(notes) == 1 and "in service in Slurm" in notes[0]
                 and not any(r["task"].endswith("Create a CUDA context on every GPU (NVSwitch GPUs without a fabric state)")
                             and r["status"] != "skipped" for r in records),
                 f"rc={result.returncode} notes={notes}\n{(lib.first_failure(records, 'el9-image') or {}).get('msg', '')}")

    rollout_stops(ladder, node, slurm)


def rollout_stops(ladder, node, slurm: dict) -> None:
    """A change without a reboot over two batches stops after the canary; its reboot handed to Slurm."""
    play, root, rollback_pins, rollback, call_times = node.play, node.root, node.pins, node.rollback, node.call_times
    # 10. A change allowed but no reboot, rolled out in the default batches over two nodes: the canary is drained and
    #     waits for its reboot; the rollout stops there instead of draining the next batch too.
    result, records, slurm = play("10-change-without-reboot", {"node": slurm["node"]}, *rollback_pins,
                                  "-e", "gpu_stack_driver_flavor=proprietary", limit="el9-image,el9-image-b")
    failure = lib.first_failure(records, "el9-image") or {}
    ladder.check("live/allow_change without reboot over two batches: the canary is changed and drained, then the rollout stops",
                 result.returncode != 0 and failure.get("msg", "").startswith("nvidia_driver: el9-image has NVIDIA driver "
                                                                             f"{rollback} installed and stays drained in Slurm until it reboots")
                 and f"kmod-nvidia-latest-dkms-{rollback}-1.el9" in lib.rpm_packages(root) and slurm["node"]["state"].endswith("DRAIN"),
                 f"rc={result.returncode} {failure.get('msg', '')}\nnode={slurm['node']}")
    ladder.check("live/... and the second batch is not touched at all",
                 not any(r["host"] == "el9-image-b" and r["task"].startswith("nvidia_driver") for r in records),
                 str(sorted({r["task"] for r in records if r["host"] == "el9-image-b"})[:8]))

    # 11. Its reboot handed to Slurm: held with a DRAIN and gpu_health's reboot reason, then scontrol reboot, no drain
    #     wait; Slurm reboots the idle node, which comes back drained (the real_slurm rung shows gpu_health resuming it).
    result, records, slurm = play("11-reboot-asap-resume", {"node": slurm["node"]}, *rollback_pins, "-e", "gpu_stack_driver_flavor=proprietary",
                                  "-e", "nvidia_driver_reboot=true", "-e", "nvidia_driver_reboot_method=slurm_asap",
                                  "-e", "gpu_stack_health_check_program=/usr/libexec/hpc-train/gpu-health-check")
    reboots = [c["argv"] for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "reboot"]]
    ladder.check("live/reboot_method slurm_asap: held with a DRAIN and gpu_health's reboot reason, one scontrol reboot, no job wait; "
                 "under ReturnToService=2 the node comes back drained with that reason (never in service unchecked)",
                 result.returncode == 0 and reboots == [["scontrol", "reboot", "gpu-a01"]]
                 and call_times(slurm, "squeue") == [] and slurm["node"]["state"] == "IDLE+DRAIN"
                 and slurm["node"]["reason"] == f"{lib.GPU_HEALTH_REBOOT_REASON} into NVIDIA driver {rollback}",
                 f"rc={result.returncode} reboots={reboots} node={slurm['node']}\n{lib.tail(result.stdout, 10)}")
