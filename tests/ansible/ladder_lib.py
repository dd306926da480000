"""Helpers shared by the ansible test ladder (ladder.py and the rungs_*.py modules): running ansible-playbook,
fake machine trees, fake EL roots, and result records."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ANSIBLE = REPO / "ansible"
EXAMPLE = ANSIBLE / "inventories" / "example"
CACHE = HERE / ".cache"
WORK = CACHE / "work"
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def _gpu_health_var(name: str) -> str:
    import yaml  # the ladder's venv has it (ansible-core's dependency)
    return yaml.safe_load((ANSIBLE / "roles" / "gpu_health" / "vars" / "main.yml").read_text())[name]


# The reason nvidia_driver's slurm_asap reboot starts with, which the gpu_health check resumes once the node is healthy.
GPU_HEALTH_REBOOT_REASON = _gpu_health_var("__gpu_health_reboot_reason_prefix")

sys.path.insert(0, str(HERE))
from fake_repos import build as fake_repos  # noqa: E402

_repo_locks: dict[str, threading.Lock] = {}
_repo_locks_guard = threading.Lock()
_repos_built: set[str] = set()


def core_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import ansible.release as r; print(r.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def ansible_env(venv: Path, record: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(HERE / "library"),
        "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "callback_plugins"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(CACHE / "ansible-tmp"),
        "ANSIBLE_DEPRECATION_WARNINGS": "false",
        # Facts come from the fixtures only (inject_facts.yml); a real gathering would put Debian's back.
        "ANSIBLE_GATHERING": "explicit",
        "PIP_CONFIG_FILE": os.devnull,  # pip in the tested venv sees only the wheels the test provides
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })
    if record is not None:
        record.unlink(missing_ok=True)
        env["ANSIBLE_CALLBACKS_ENABLED"] = "record_results"
        env["HPC_TRAIN_RECORD"] = str(record)
    env.update(extra)
    return env


def with_stand_ins(env: dict[str, str], *kinds: str) -> dict[str, str]:
    """Put stand-in commands (fake_slurm: scontrol, squeue, systemctl; fake_gpu: nvidia-smi) first on PATH."""
    env["PATH"] = ":".join([str(HERE / kind / "bin") for kind in kinds] + [env["PATH"]])
    return env


# The pipelines off the critical path (ladder.py) run their commands niced, so the longest one gets the CPU first.
_pipeline = threading.local()


def set_niceness(niceness: int) -> None:
    _pipeline.niceness = niceness


def run(argv: list[str], env: dict[str, str], log: Path, cwd: Path = HERE) -> subprocess.CompletedProcess:
    niceness = getattr(_pipeline, "niceness", 0)
    command = ["nice", "-n", str(niceness), *argv] if niceness else argv
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n")
    return result


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def counts(records: list[dict]) -> tuple[int, int]:
    return sum(r["changed"] for r in records), sum(r["status"] == "failed" for r in records)


def write_state(path: Path, state: dict) -> Path:
    path.write_text(json.dumps(state, indent=1))
    return path


# ------------------------------------------------------------------------------------------------ fake EL roots


def ensure_repos(name: str) -> Path:
    """The fake repositories under WORK/<name>, built once per ladder run (the rungs that use them share them)."""
    with _repo_locks_guard:
        lock = _repo_locks.setdefault(name, threading.Lock())
    repos = WORK / name
    with lock:
        if name not in _repos_built:
            fake_repos.main(repos)
            _repos_built.add(name)
    return repos


def make_image_root(name: str, repos: Path, copy_from: Path | None = None, lock_active: bool = False,
                    base_os: bool = True) -> dict[str, Path]:
    """An EL root (empty but for its "base OS", or a copy of another) with the site's BaseOS mirror configured, and a
    dnf.conf for it. The base OS is the shell (so rpm can run scriptlets in it) and kernel-core of the kernel it is
    built for, installed straight with rpm like the OS image a site starts from.

    For an image build the build host's versionlock plugin is off (the image's lock list is not the build host's);
    the verify step uses a second plugin config that reads the image's list, like dnf inside the image. A live
    node (lock_active) is the other way round: its dnf honours its own lock list.
    """
    base = WORK / name
    shutil.rmtree(base, ignore_errors=True)
    root = base / "root"
    if copy_from is not None:
        base.mkdir(parents=True)
        shutil.copytree(copy_from, root, symlinks=True)
    (root / "etc" / "yum.repos.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "yum.repos.d" / "site-baseos.repo").write_text(
        f"[site-baseos]\nname=Site BaseOS mirror (fake)\nbaseurl=file://{repos}/baseos/\nenabled=1\ngpgcheck=0\n")
    if copy_from is None and base_os:
        rpm_install(root, fake_repos.base_os_rpms(repos))
    paths = {"root": root, "conf": base / "dnf.conf", "plugins_off": base / "plugins-off", "plugins_image": base / "plugins-image"}
    paths["conf"].write_text(
        "[main]\ngpgcheck=0\ninstallonly_limit=3\nkeepcache=0\n"
        f"reposdir={root}/etc/yum.repos.d\nmodule_platform_id=platform:el9\n"
        f"pluginconfpath={paths['plugins_image'] if lock_active else paths['plugins_off']}\n")
    for key, enabled in (("plugins_off", 0), ("plugins_image", 1)):
        paths[key].mkdir()
        (paths[key] / "versionlock.conf").write_text(
            f"[main]\nenabled = {enabled}\nlocklist = {root}/etc/dnf/plugins/versionlock.list\n")
    return paths


def rpm_install(root: Path, rpms: list[Path]) -> None:
    """Install rpms into a root without dnf (a test's "already there" state)."""
    subprocess.run(["rpm", "--root", str(root), "-i", "--nodeps", *map(str, rpms)], check=True, capture_output=True)


def set_running_kernel(root: Path, kernel: str) -> None:
    """A live test node cannot boot its own kernel: the dkms stand-in builds for the one named here."""
    (root / "etc" / "hpc-train-stand-in").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "hpc-train-stand-in" / "running-kernel").write_text(kernel + "\n")


def rpm_packages(root: Path) -> set[str]:
    out = subprocess.run(["rpm", "--root", str(root), "-qa", "--queryformat", "%{NAME}-%{VERSION}-%{RELEASE}\\n"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def module_stream(root: Path) -> str:
    path = root / "etc" / "dnf" / "modules.d" / "nvidia-driver.module"
    text = path.read_text() if path.exists() else ""
    match = re.search(r"^stream=(\S*)$", text, re.M)
    return match.group(1) if match and "state=enabled" in text else ""


def lock_block(root: Path, role: str = "nvidia_driver") -> list[str]:
    path = root / "etc" / "dnf" / "plugins" / "versionlock.list"
    text = path.read_text() if path.exists() else ""
    match = re.search(rf"# BEGIN hpc-train {role} locks\n(.*?)# END hpc-train {role} locks", text, re.S)
    return match.group(1).split() if match else []


def built_modules(root: Path, kernel: str) -> list[str]:
    """'<version> <licence>' of every nvidia.ko built for the kernel, read with the real modinfo."""
    found = sorted((root / "lib" / "modules" / kernel).rglob("nvidia.ko*")) if (root / "lib" / "modules" / kernel).exists() else []
    result = []
    for module in found:
        out = subprocess.run(["modinfo", "-F", "version", str(module)], capture_output=True, text=True).stdout.strip()
        licence = subprocess.run(["modinfo", "-F", "license", str(module)], capture_output=True, text=True).stdout.strip()
        result.append(f"{out} {licence}")
    return result


def dnf_upgrade_plan(image: dict[str, Path], plugins: Path) -> str:
    """What `dnf upgrade` inside the image would do (answers no)."""
    result = subprocess.run(["dnf", "--assumeno", "--config", str(image["conf"]), f"--setopt=pluginconfpath={plugins}",
                             "--installroot", str(image["root"]), "--releasever", "9", "upgrade"], capture_output=True, text=True)
    return result.stdout + result.stderr


def build_fixture_machine(fixture: dict, machine_dir: Path) -> None:
    """Create <machine_dir>/root (a system root with the fixture's root_files, and a slurm.conf unless a root_files
    entry for it is null) and the fixture's fake /sys: PCI functions and EFI vars.

    PCI functions are laid out like the real sysfs: /sys/bus/pci/devices/<addr> is a symlink into
    /sys/devices/pci0000:00/<addr>, which holds the 'vendor', 'class' and 'device' files.
    """
    (machine_dir / "root" / "etc").mkdir(parents=True, exist_ok=True)
    # A classic Slurm node (its own slurm.conf) unless the fixture says otherwise.
    files = {"/etc/slurm/slurm.conf": "ClusterName=site\n", **fixture.get("root_files", {})}
    for path, content in files.items():
        if content is None:  # the fixture has no such file
            continue
        target = machine_dir / "root" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    sys_dir = machine_dir / "sys"
    bus_dir = sys_dir / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    for index, (vendor, pci_class, *device) in enumerate(fixture["pci_devices"]):
        address = f"0000:{0x17 + index:02x}:00.0"
        device_dir = sys_dir / "devices" / "pci0000:00" / address
        device_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "vendor").write_text(vendor + "\n")
        (device_dir / "class").write_text(pci_class + "\n")
        # PCI device id: the GPU's model (default 0x2330, H100 SXM5).
        (device_dir / "device").write_text((device[0] if device else "0x2330") + "\n")
        link = bus_dir / address
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(device_dir, bus_dir))
    efivars = sys_dir / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True, exist_ok=True)
    # 4 attribute bytes (NV+BS+RT) and the value byte.
    (efivars / SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00" + (b"\x01" if fixture["secure_boot"] else b"\x00"))


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> content): what a check run must leave unchanged. rpm's database is left
    out: a read-only `rpm --root ROOT -qa` creates an empty one (Debian's rpm keeps it in ~/.rpmdb)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith(("root/.rpmdb", "var/lib/rpm"))}


def read_records(path: Path) -> list[dict]:
    """Records written by callback_plugins/record_results.py, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def file_afters(records: list[dict], host: str, sysroot: str) -> dict[str, str]:
    """Path (relative to the host's sysroot) -> the 'after' text of the last task that wrote it. The items of one
    looped task (lineinfile over several keys, each diffed against the unwritten file in check mode) are joined."""
    afters: dict[str, str] = {}
    for record in records:
        if record["host"] != host:
            continue
        diffs = list(record["diff"]) + [d for item in record["results"] for d in (item["diff"] if isinstance(item["diff"], list) else [item["diff"]])]
        this_task: dict[str, list[str]] = {}
        for diff in diffs:
            if not isinstance(diff, dict) or "after" not in diff:
                continue
            # template: before_header is the destination (after_header is a temp file); blockinfile: "<path> (content)".
            headers = [diff.get("before_header") or "", diff.get("after_header") or ""]
            header = next((h for h in headers + [record.get("dest", "")] if h.startswith(sysroot)), headers[0] or headers[1])
            header = header.removesuffix(" (content)")
            if header.startswith(sysroot):
                header = header[len(sysroot):]
            this_task.setdefault(header, []).append(diff["after"] if isinstance(diff["after"], str) else json.dumps(diff["after"]))
        afters.update({path: "\n".join(texts) for path, texts in this_task.items()})
    return afters


def host_facts(records: list[dict], host: str) -> dict:
    """All facts set for the host by set_fact and modules, later ones winning."""
    facts: dict = {}
    for record in records:
        if record["host"] == host and record["status"] == "ok":
            facts.update(record["facts"])
    return facts


def first_failure(records: list[dict], host: str) -> dict | None:
    """The failure that stopped the host: the last failed result (earlier ones may have been rescued)."""
    return next((r for r in reversed(records) if r["host"] == host and r["status"] in ("failed", "unreachable")), None)
