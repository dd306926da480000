"""The Ansible test ladder (run by run.sh): every rung runs the real ansible-playbook / ansible-lint / dnf.

Rungs, each printed with its wall time:
  static[<core>]    --syntax-check of every playbook and ansible-lint --profile production, per ansible-core
  unit              pytest: role templates against golden files, role rules, hpc_train.provision
  check[<core>]     gpu_nodes.yml --check --diff over EL7/EL8/EL9/Alma9 fixtures and the negative fixtures,
                    per ansible-core; decisions, file diffs and exact failure messages from fixtures/check_expectations.yml
  converge          image_build.yml with dnf into an EL9 image root from fake repositories (ansible-core 2.16):
                    converge, idempotence, verify, then negative cases and an allowed flavour switch
  missing_branch    the same into an empty root, for a driver branch the mirror lacks
  live_change       a driver change on a live node: drain, wait for jobs, admin drains kept (Slurm CLI stand-ins)
  gpu_validate      the node checks of validate.yml against a stand-in nvidia-smi
  pytorch_env       the pytorch_env role for real, from a directory of stand-in wheels

Two pipelines run in parallel threads (see main). Every check prints PASS or FAIL; the last line is
"N passed, N failed". Usage:
    python ladder.py --core-216 VENV --core-current VENV [--only RUNG ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ladder_lib  # noqa: E402
from fake_repos import build as fake_repos  # noqa: E402
import fake_wheels  # noqa: E402

REPO = HERE.parent.parent
ANSIBLE = REPO / "ansible"
EXAMPLE = ANSIBLE / "inventories" / "example"
CACHE = HERE / ".cache"
WORK = CACHE / "work"
PLAYBOOKS = ["site.yml", "gpu_nodes.yml", "validate.yml", "image_build.yml"]
IMAGE_KERNEL = fake_repos.KERNEL + ".x86_64"
MISSING_KERNEL = "5.14.0-362.8.1.el9_3.x86_64"  # a kernel the fake mirror does not carry


class Ladder:
    """Counts checks. Rungs run in two threads (see main); each rung's lines are printed together when it ends."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def _say(self, line: str) -> None:
        self._local.__dict__.setdefault("lines", []).append(line)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        with self._lock:
            if ok:
                self.passed += 1
            else:
                self.failed.append(name)
        if ok:
            self._say(f"PASS  {name}")
        else:
            self._say(f"FAIL  {name}" + (f"\n      {str(detail).strip()}".replace("\n", "\n      ") if detail else ""))
        return ok

    @contextmanager
    def rung(self, name: str):
        start = time.monotonic()
        self._local.lines = [f"--- {name}"]
        try:
            yield
        except Exception as exc:  # a broken rung is a failure of that rung, not the end of the ladder
            self.check(f"{name}: ran to the end", False, f"{type(exc).__name__}: {exc}")
        self._say(f"--- {name}: {time.monotonic() - start:.1f} s")
        with self._lock:
            print("\n".join(self._local.lines), flush=True)


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


def run(argv: list[str], env: dict[str, str], log: Path, cwd: Path = HERE) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n")
    return result


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ------------------------------------------------------------------------------------------------ static


def static(ladder: Ladder, venv: Path, label: str) -> None:
    env = ansible_env(venv)
    for playbook in PLAYBOOKS:
        result = run([str(venv / "bin" / "ansible-playbook"), "-i", str(EXAMPLE), "--syntax-check", playbook], env,
                     WORK / "logs" / f"syntax-{label}-{playbook}.log", cwd=ANSIBLE)
        ladder.check(f"static[{label}]/syntax-check {playbook}", result.returncode == 0, tail(result.stdout + result.stderr))
    result = run([str(venv / "bin" / "ansible-lint", ), "--offline", "--profile", "production", "--nocolor"], env,
                 WORK / "logs" / f"lint-{label}.log", cwd=ANSIBLE)
    summary = (result.stdout + result.stderr).strip().splitlines()
    ladder.check(f"static[{label}]/ansible-lint production", result.returncode == 0 and any("Passed" in s for s in summary),
                 tail(result.stdout + result.stderr, 30))


# ------------------------------------------------------------------------------------------------ unit


def unit(ladder: Ladder, venv: Path) -> None:
    junit = WORK / "unit-junit.xml"
    junit.unlink(missing_ok=True)
    result = run([str(venv / "bin" / "python"), "-m", "pytest", "-c", str(HERE / "pytest.ini"), "-q", f"--junitxml={junit}",
                  "test_templates.py", "test_role_rules.py", "test_provision.py"], ansible_env(venv), WORK / "logs" / "unit.log")
    if not junit.exists():
        ladder.check("unit/pytest ran", False, tail(result.stdout + result.stderr))
        return
    cases = ET.parse(junit).getroot().iter("testcase")
    count = 0
    for case in cases:
        count += 1
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped") is not None
        name = f"unit/{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        ladder.check(name, problem is None and not skipped,
                     (problem.get("message", "") if problem is not None else "skipped: a skip is a failure here"))
    ladder.check("unit/pytest found tests and exited 0", count > 0 and result.returncode == 0, tail(result.stdout))


# ------------------------------------------------------------------------------------------------ check mode


def check_mode(ladder: Ladder, venv: Path, label: str) -> None:
    version = core_version(venv)
    newer = tuple(int(x) for x in version.split(".")[:2]) >= (2, 17)
    check_root = WORK / f"check-{label}"
    shutil.rmtree(check_root, ignore_errors=True)
    fixtures = {p.stem: json.loads(p.read_text()) for p in sorted((HERE / "fixtures" / "facts").glob("*.json"))}
    for host, fixture in fixtures.items():
        ladder_lib.build_fixture_machine(fixture, check_root / host)
    record = WORK / f"check-{label}.jsonl"
    result = run([str(venv / "bin" / "ansible-playbook"), "-i", str(EXAMPLE), "-i", str(HERE / "inventories" / "check" / "hosts.yml"),
                  "--limit", "fixtures", "-e", f"check_root={check_root}", "-e", f"fixtures_dir={HERE / 'fixtures'}",
                  # All fixture hosts in one batch: the rollout batching is Ansible's own serial, not under test.
                  "-e", '{"gpu_nodes_rollout_batches": ["100%"]}',
                  "--check", "--diff", "--skip-tags", "packages", "check_mode.yml"],
                 ansible_env(venv, record), WORK / "logs" / f"check-{label}.log")
    records = ladder_lib.read_records(record)
    ladder.check(f"check[{label}]/ansible-playbook ran every fixture host", {r["host"] for r in records} == set(fixtures),
                 tail(result.stdout + result.stderr))
    expectations = yaml.safe_load((HERE / "fixtures" / "check_expectations.yml").read_text())
    assert set(expectations) == set(fixtures), "every fixture needs expectations"
    for host, expect in expectations.items():
        if newer and "newer_core" in expect:
            expect = expect["newer_core"]
        name = f"check[{label}]/{host}"
        failure = ladder_lib.first_failure(records, host)
        if "failure" in expect:
            wanted = expect["failure"].format(core=version)
            got = (failure or {}).get("msg", "")
            ladder.check(f"{name}: refused with the exact message", failure is not None and got.strip() == wanted.strip(),
                         f"wanted: {wanted}\ngot:    {got or 'no failure'}")
            continue
        ladder.check(f"{name}: no task failed", failure is None, json.dumps(failure)[:800] if failure else "")
        facts = ladder_lib.host_facts(records, host)
        for key, value in expect.get("facts", {}).items():
            # ansible-core 2.16 templates numbers to strings, 2.19 keeps them native: compare numbers as text.
            got = facts.get(key, "<unset>")
            same = str(got) == str(value) if isinstance(value, int) and not isinstance(value, bool) else got == value
            ladder.check(f"{name}: decision {key}", same, f"wanted {value!r}, got {got!r}")
        sysroot = str(check_root / host / "root")
        afters = ladder_lib.file_afters(records, host, sysroot)
        for path, lines in expect.get("files", {}).items():
            text = afters.get(path)
            missing = [line for line in lines if text is None or line not in [t.strip() for t in text.splitlines()]]
            ladder.check(f"{name}: diff of {path}", text is not None and not missing,
                         f"no diff for {path}" if text is None else f"missing lines {missing} in:\n{text}")
        for path in expect.get("absent", []):
            ladder.check(f"{name}: does not write {path}", path not in afters)
        written = [path for path in afters if path.startswith("/")]
        ladder.check(f"{name}: check mode left the root untouched", not any((check_root / host / "root" / p.lstrip("/")).exists() for p in written),
                     "files were written in check mode")


# ------------------------------------------------------------------------------------------------ converge


def make_image_root(name: str, repos: Path, copy_from: Path | None = None, lock_active: bool = False) -> dict[str, Path]:
    """An empty image root (or a copy of one) with the site's BaseOS mirror configured, and a dnf.conf for it.

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


def converge_run(venv: Path, image: dict[str, Path], repos: Path, label: str, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    record = WORK / f"converge-{label}.jsonl"
    result = run([str(venv / "bin" / "ansible-playbook"), "-i", str(EXAMPLE), "-i", str(HERE / "inventories" / "converge" / "hosts.yml"),
                  "--limit", "el9-image", "-e", f"fixtures_dir={HERE / 'fixtures'}", "-e", f"fake_repos={repos}",
                  "-e", "image_build_hosts=el9-image", "-e", f"image_build_sysroot={image['root']}",
                  "-e", f"image_build_kernel_version={IMAGE_KERNEL}", "-e", f"image_build_dnf_conf_file={image['conf']}",
                  "-e", "image_build_releasever=9", *extra, "converge.yml"],
                 ansible_env(venv, record), WORK / "logs" / f"converge-{label}.log")
    return result, ladder_lib.read_records(record)


def rpm_packages(root: Path) -> set[str]:
    out = subprocess.run(["rpm", "--root", str(root), "-qa", "--queryformat", "%{NAME}-%{VERSION}-%{RELEASE}\\n"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def module_stream(root: Path) -> str:
    path = root / "etc" / "dnf" / "modules.d" / "nvidia-driver.module"
    text = path.read_text() if path.exists() else ""
    match = re.search(r"^stream=(\S*)$", text, re.M)
    return match.group(1) if match and "state=enabled" in text else ""


def lock_block(root: Path) -> list[str]:
    path = root / "etc" / "dnf" / "plugins" / "versionlock.list"
    text = path.read_text() if path.exists() else ""
    match = re.search(r"# BEGIN hpc-train nvidia_driver locks\n(.*?)# END hpc-train nvidia_driver locks", text, re.S)
    return match.group(1).split() if match else []


def dnf_upgrade_plan(image: dict[str, Path], plugins: Path) -> str:
    """What `dnf upgrade` inside the image would do (answers no)."""
    result = subprocess.run(["dnf", "--assumeno", "--config", str(image["conf"]), f"--setopt=pluginconfpath={plugins}",
                             "--installroot", str(image["root"]), "--releasever", "9", "upgrade"], capture_output=True, text=True)
    return result.stdout + result.stderr


def counts(records: list[dict]) -> tuple[int, int]:
    return sum(r["changed"] for r in records), sum(r["status"] == "failed" for r in records)


def converge(ladder: Ladder, venv: Path) -> None:
    repos = WORK / "repos"
    summary = fake_repos.main(repos)
    ladder.check("converge/fake EL9 repositories built (rpmbuild, createrepo_c, modifyrepo_c)",
                 (repos / "cuda" / "repodata" / "repomd.xml").read_text().count('type="modules"') == 1,
                 json.dumps(summary)[:500])
    image = make_image_root("image", repos)
    root = image["root"]
    old, new = fake_repos.DRIVER_VERSIONS
    driver = f"{old}-1.el9"

    result, records = converge_run(venv, image, repos, "1-converge")
    changed, failed = counts(records)
    if not ladder.check("converge/first run succeeds and changes the image", result.returncode == 0 and failed == 0 and changed > 10,
                        f"rc={result.returncode} changed={changed}\n{tail(result.stdout, 25)}"):
        return
    result, records = converge_run(venv, image, repos, "2-idempotence")
    changed, failed = counts(records)
    ladder.check("converge/second run changes nothing", result.returncode == 0 and changed == 0,
                 "changed: " + ", ".join(r["task"] for r in records if r["changed"]))

    # verify: what the image must contain, by intent
    packages = rpm_packages(root)
    wanted = {f"nvidia-driver-cuda-{driver}", f"kmod-nvidia-open-dkms-{driver}", f"nvidia-persistenced-{driver}",
              f"nvidia-fabric-manager-{driver}", f"kernel-devel-{fake_repos.KERNEL}", f"kernel-headers-{fake_repos.KERNEL}",
              f"dkms-{fake_repos.DKMS_VERSION}-1.el9", "cuda-toolkit-12-8-12.8.1-1",
              f"libnccl-{fake_repos.NCCL_VERSION}-{fake_repos.NCCL_RELEASE}", "python3-dnf-plugin-versionlock-4.3.0-13.el9",
              "rdma-core-48.0-1.el9"}
    ladder.check("verify/the pinned driver, its kernel headers, dkms, CUDA, NCCL, fabric manager and rdma-core are installed",
                 wanted <= packages, f"missing: {sorted(wanted - packages)}")
    ladder.check("verify/no package of the other flavour or the newer release",
                 not any(p.startswith("kmod-nvidia-latest-dkms") or new in p for p in packages), sorted(packages))
    ladder.check("verify/module stream nvidia-driver:570-open is enabled", module_stream(root) == "570-open", module_stream(root))
    lock = lock_block(root)
    ladder.check("verify/versionlock holds the driver packages and the kernel",
                 {f"nvidia-driver-cuda-3:{driver}.*", f"kmod-nvidia-open-dkms-3:{driver}.*", f"nvidia-fabric-manager-3:{driver}.*",
                  f"kernel-devel-0:{fake_repos.KERNEL}.*", f"kernel-0:{fake_repos.KERNEL}.*"} <= set(lock), lock)
    unlocked = dnf_upgrade_plan(image, image["plugins_off"])
    locked = dnf_upgrade_plan(image, image["plugins_image"])
    ladder.check("verify/without the lock, dnf upgrade would move the driver to the newer release", f"3:{new}-1.el9" in unlocked, tail(unlocked))
    ladder.check("verify/with the image's lock, dnf upgrade has nothing to do", "Nothing to do." in locked and new not in locked, tail(locked))
    files = {
        "etc/slurm/gres.conf": "Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-47",
        "etc/slurm/cgroup.conf": "ConstrainDevices=yes",
        "etc/modprobe.d/blacklist-nouveau.conf": "blacklist nouveau",
        "etc/modules-load.d/nvidia-peermem.conf": "nvidia-peermem",
        "etc/profile.d/cuda.sh": "CUDA_HOME=/usr/local/cuda-12.8",
        "etc/yum.repos.d/hpc-train-gpu.repo": f"baseurl=file://{repos}/cuda/",
        "etc/firewalld/zones/hpc-train-fabric.xml": '<source address="10.10.0.0/16"/>',
    }
    for path, line in files.items():
        text = (root / path).read_text() if (root / path).exists() else ""
        ladder.check(f"verify/{path}", line in text.splitlines() or line in text, text or "missing")
    links = {"usr/local/cuda": "/usr/local/cuda-12.8",
             "etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service": "/usr/lib/systemd/system/nvidia-persistenced.service",
             "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service": "/usr/lib/systemd/system/nvidia-fabricmanager.service"}
    for path, target in links.items():
        link = root / path
        ladder.check(f"verify/{path} -> {target} (and the target is in the image)",
                     link.is_symlink() and os.readlink(link) == target and (root / target.lstrip("/")).exists(),
                     os.readlink(link) if link.is_symlink() else "not a symlink")

    # negative cases
    before = rpm_packages(root)
    result, records = converge_run(venv, image, repos, "3-missing-kernel-devel", "-e", f"image_build_kernel_version={MISSING_KERNEL}")
    failure = ladder_lib.first_failure(records, "el9-image") or {}
    ladder.check("negative/kernel-devel for the target kernel missing from the mirror: refused with a clear message",
                 result.returncode != 0 and failure.get("msg", "").startswith(
                     f"gpu_preflight: kernel-devel-{MISSING_KERNEL} (for the kernel the driver is built for) is not in any "
                     "enabled repository, so DKMS cannot build the NVIDIA module.")
                 and f"No package kernel-devel-{MISSING_KERNEL} available" in failure.get("msg", ""), failure.get("msg", ""))
    ladder.check("negative/missing kernel-devel: nothing changed", rpm_packages(root) == before and counts(records)[0] == 0)

    result, records = converge_run(venv, image, repos, "4-flavour-switch-refused", "-e", "gpu_stack_driver_flavor=proprietary")
    failure = ladder_lib.first_failure(records, "el9-image") or {}
    wanted = (f"nvidia_driver: el9-image has driver {old} (open); the inventory asks for {old} (proprietary). A driver change is "
              "refused unless you pass -e nvidia_driver_allow_change=true: the node is then drained in Slurm and its jobs waited "
              "for, and it reboots only with -e nvidia_driver_reboot=true.")
    ladder.check("negative/flavour switch on an installed driver: refused with the exact message", failure.get("msg", "") == wanted,
                 f"wanted: {wanted}\ngot:    {failure.get('msg', '')}")
    ladder.check("negative/refused flavour switch: packages, stream and lock untouched",
                 rpm_packages(root) == before and module_stream(root) == "570-open" and lock_block(root) == lock)

    result, records = converge_run(venv, image, repos, "5-flavour-switch-allowed", "-e", "gpu_stack_driver_flavor=proprietary",
                                   "-e", "nvidia_driver_allow_change=true")
    packages = rpm_packages(root)
    ladder.check("change/allowed flavour switch succeeds", result.returncode == 0, tail(result.stdout, 25))
    ladder.check("change/only the proprietary kernel module is installed, at the pinned version",
                 f"kmod-nvidia-latest-dkms-{driver}" in packages and not any(p.startswith("kmod-nvidia-open-dkms") for p in packages),
                 sorted(p for p in packages if "nvidia" in p))
    ladder.check("change/module stream switched to 570-dkms", module_stream(root) == "570-dkms", module_stream(root))
    new_lock = lock_block(root)
    ladder.check("change/the lock follows the new kernel module",
                 f"kmod-nvidia-latest-dkms-3:{driver}.*" in new_lock and not any("open-dkms" in e for e in new_lock), new_lock)
    result, records = converge_run(venv, image, repos, "6-after-switch", "-e", "gpu_stack_driver_flavor=proprietary",
                                   "-e", "nvidia_driver_allow_change=true")
    ladder.check("change/rerun after the switch changes nothing", result.returncode == 0 and counts(records)[0] == 0,
                 "changed: " + ", ".join(r["task"] for r in records if r["changed"]))


def missing_branch(ladder: Ladder, venv: Path) -> None:
    """A driver branch the mirror does not carry, on an empty image root (independent of the converge rung)."""
    repos = WORK / "repos-branch"
    fake_repos.main(repos)
    fresh = make_image_root("image-fresh", repos)
    result, records = converge_run(venv, fresh, repos, "missing-branch", "-e", "gpu_stack_driver_branch=580",
                                   "-e", "gpu_stack_driver_version=")
    failure = ladder_lib.first_failure(records, "el9-image") or {}
    ladder.check("negative/driver branch missing from the mirror: refused with a clear message",
                 failure.get("msg", "").startswith(
                     "nvidia_driver: the repositories have no nvidia-driver:580-open module stream, so driver branch 580 (open) "
                     "cannot be installed.") and "nvidia-driver:580-open" in failure.get("msg", "").split("dnf said:")[-1],
                 failure.get("msg", ""))
    ladder.check("negative/missing branch: no driver package installed",
                 not any(p.startswith(("nvidia-", "kmod-nvidia")) for p in rpm_packages(fresh["root"])))


# ------------------------------------------------------------------------------------------------ live change


def live_change(ladder: Ladder, venv: Path) -> None:
    """A driver change on a running node: drain first, wait for the jobs, never resume an admin's drain, never
    reboot over a local connection. The node is a copy of the converged image root (proprietary flavour by now),
    run in live mode (not an image build); scontrol/squeue are fake_slurm/ stand-ins that record every call."""
    repos = WORK / "repos"
    source = WORK / "image" / "root"
    if not ladder.check("live/an installed root from the converge rung exists", (source / "var").exists()):
        return
    node = make_image_root("live", repos, copy_from=source, lock_active=True)
    machine = WORK / "live-machine"
    shutil.rmtree(machine, ignore_errors=True)
    ladder_lib.build_fixture_machine(json.loads((HERE / "fixtures" / "facts" / "el9.json").read_text()), machine)
    slurm_state = WORK / "live-slurm.json"
    driver = f"{fake_repos.DRIVER_VERSIONS[0]}-1.el9"

    def play(label: str, slurm: dict, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
        slurm_state.write_text(json.dumps({"calls": [], **slurm}))
        record = WORK / f"live-{label}.jsonl"
        env = ansible_env(venv, record, HPC_TRAIN_FAKE_SLURM=str(slurm_state))
        env["PATH"] = f"{HERE / 'fake_slurm' / 'bin'}:{env['PATH']}"
        result = run([str(venv / "bin" / "ansible-playbook"), "-i", str(EXAMPLE), "-i", str(HERE / "inventories" / "converge" / "hosts.yml"),
                      "--limit", "el9-image", "--tags", "preflight,driver", "-e", f"fixtures_dir={HERE / 'fixtures'}",
                      "-e", f"fake_repos={repos}", "-e", f"gpu_stack_sysroot={node['root']}", "-e", f"gpu_stack_dnf_conf_file={node['conf']}",
                      "-e", "gpu_stack_releasever=9", "-e", "gpu_stack_manage_services=false",
                      "-e", f"gpu_preflight_pci_devices_path={machine}/sys/bus/pci/devices",
                      "-e", f"gpu_preflight_efivars_path={machine}/sys/firmware/efi/efivars",
                      "-e", "nvidia_driver_allow_change=true", "-e", "nvidia_driver_drain_poll_s=1",
                      "-e", '{"gpu_nodes_rollout_batches": ["100%"]}', *extra, "live_change.yml"],
                     env, WORK / "logs" / f"live-{label}.log")
        return result, ladder_lib.read_records(record), json.loads(slurm_state.read_text())

    def updates(slurm: dict) -> list[list[str]]:
        return [c["argv"] for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "update"]]

    before = rpm_packages(node["root"])
    busy = {"node": {"name": "gpu01", "state": "MIXED", "reason": ""}, "jobs": ["4242"]}
    result, records, slurm = play("1-jobs-outlast-the-timeout", {**busy, "polls_until_done": None},
                                  "-e", "gpu_stack_driver_flavor=open", "-e", "nvidia_driver_drain_timeout_s=2")
    failure = ladder_lib.first_failure(records, "el9-image") or {}
    ladder.check("live/jobs outlast the drain timeout: stopped with a clear message",
                 failure.get("msg", "") == "nvidia_driver: jobs 4242 still run on gpu01 after 2 s; nothing was changed and the node "
                 "stays drained. Rerun when they have ended (or raise nvidia_driver_drain_timeout_s).", failure.get("msg", ""))
    ladder.check("live/jobs outlast the timeout: node drained with our reason, packages untouched",
                 slurm["node"]["state"] == "MIXED+DRAIN" and slurm["node"]["reason"].startswith("hpc-train")
                 and rpm_packages(node["root"]) == before, json.dumps(slurm["node"]))

    result, records, slurm = play("2-drain-then-change", {**busy, "polls_until_done": 2},
                                  "-e", "gpu_stack_driver_flavor=open", "-e", "nvidia_driver_drain_timeout_s=60",
                                  "-e", "nvidia_driver_reboot=true")
    packages = rpm_packages(node["root"])
    ladder.check("live/the driver changed once the jobs had ended",
                 f"kmod-nvidia-open-dkms-{driver}" in packages and not any(p.startswith("kmod-nvidia-latest") for p in packages),
                 tail(result.stdout, 20))
    polls = [c["time"] for c in slurm["calls"] if c["argv"][0] == "squeue"]
    drained = [c["time"] for c in slurm["calls"] if c["argv"][:2] == ["scontrol", "update"] and "State=DRAIN" in c["argv"]]
    query = subprocess.run(["rpm", "--root", str(node["root"]), "-q", "--queryformat", "%{INSTALLTIME}", "kmod-nvidia-open-dkms"],
                           capture_output=True, text=True)
    installed = int(query.stdout) if query.returncode == 0 else 0
    ladder.check("live/order: drain, then polls until no job is left, then the package change",
                 len(drained) == 1 and len(polls) == 2 and drained[0] < polls[0] and installed >= int(polls[-1]),
                 f"drain={drained} polls={polls} kmod installed at {installed}")
    failure = ladder_lib.first_failure(records, "el9-image") or {}
    ladder.check("live/reboot asked over a local connection: refused, node not resumed",
                 failure.get("msg", "") == "nvidia_driver: el9-image is reached over a local connection; rebooting it would reboot the controller."
                 and not any("State=RESUME" in u for u in updates(slurm)) and slurm["node"]["state"].endswith("DRAIN"),
                 f"{failure.get('msg', '')}\n{json.dumps(slurm['node'])}")

    result, records, slurm = play("3-admin-drained-node", {"node": {"name": "gpu01", "state": "IDLE+DRAIN", "reason": "bad fan"},
                                                          "jobs": [], "polls_until_done": 0},
                                  "-e", "gpu_stack_driver_flavor=proprietary")
    packages = rpm_packages(node["root"])
    ladder.check("live/a node an admin drained: changed without touching its Slurm state",
                 result.returncode == 0 and f"kmod-nvidia-latest-dkms-{driver}" in packages and updates(slurm) == []
                 and slurm["node"] == {"name": "gpu01", "state": "IDLE+DRAIN", "reason": "bad fan"},
                 f"rc={result.returncode} updates={updates(slurm)} node={slurm['node']}\n{tail(result.stdout, 12)}")
    messages = [r["msg"] for r in records if r["task"].endswith("Report the reboot that is still needed")]
    ladder.check("live/no reboot asked: says a reboot is pending", any("it is loaded after a reboot" in m for m in messages), str(messages))

    # The admin updated the kernel deliberately and rebooted: the node now runs a kernel the role's lock does not name.
    newer = fake_repos.NEWER_KERNEL
    result, records, slurm = play("4-after-a-kernel-update", {"node": {"name": "gpu01", "state": "IDLE", "reason": ""}, "jobs": [],
                                                              "polls_until_done": 0},
                                  "-e", "gpu_stack_driver_flavor=proprietary", "-e", f"gpu_preflight_kernel_version={newer}.x86_64",
                                  "-e", f"nvidia_driver_kernel_version={newer}.x86_64")
    lock = lock_block(node["root"])
    ladder.check("live/after a kernel update: kernel-devel for the new kernel installed despite the old lock, lock moved to it",
                 result.returncode == 0 and f"kernel-devel-{newer}" in rpm_packages(node["root"])
                 and f"kernel-devel-0:{newer}.*" in lock and not any(fake_repos.KERNEL in entry for entry in lock)
                 and updates(slurm) == [], f"rc={result.returncode} lock={lock}\n{tail(result.stdout, 12)}")


# ------------------------------------------------------------------------------------------------ gpu_validate


def gpu_validate(ladder: Ladder, venv: Path) -> None:
    """gpu_validate's node checks with a stand-in nvidia-smi (fake_gpu/): the GPUs are what cannot exist here."""
    base = WORK / "gpu-validate"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    smi_rows, version_file = base / "smi.csv", base / "nvidia-version"

    def play(label: str, driver: str | None) -> tuple[subprocess.CompletedProcess, list[dict]]:
        if driver is None:
            version_file.unlink(missing_ok=True)
        else:
            version_file.write_text(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}\n")
            smi_rows.write_text("".join(f"{i}, NVIDIA H100 80GB HBM3, {driver}, Enabled\n" for i in range(8)))
        record = WORK / f"gpu-validate-{label}.jsonl"
        env = ansible_env(venv, record, HPC_TRAIN_FAKE_SMI=str(smi_rows))
        env["PATH"] = f"{HERE / 'fake_gpu' / 'bin'}:{env['PATH']}"
        result = run([str(venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"fixtures_dir={HERE / 'fixtures'}",
                      "-e", f"driver_version_file={version_file}", "-e", "ansible_become=false", "validate_gpus.yml"],
                     env, WORK / "logs" / f"gpu-validate-{label}.log")
        return result, ladder_lib.read_records(record)

    result, records = play("1-good", "570.172.08")
    checked = [r for r in records if r["task"].endswith("Check the driver branch, the GPU count and persistence mode")]
    ladder.check("gpu_validate/8 GPUs on branch 570 in persistence mode pass",
                 result.returncode == 0 and [r["status"] for r in checked] == ["ok"], tail(result.stdout, 15))
    result, records = play("2-wrong-branch", "550.127.08")
    failure = ladder_lib.first_failure(records, "localhost") or {}
    ladder.check("gpu_validate/a driver of another branch is reported",
                 failure.get("msg", "").startswith("gpu_validate: nvidia-smi on localhost says ['0, NVIDIA H100 80GB HBM3, 550.127.08, Enabled'")
                 and failure.get("msg", "").endswith("expected 8 GPU(s) on driver branch 570 in persistence mode."), failure.get("msg", ""))
    result, records = play("3-reboot-pending", None)
    notes = [r["msg"] for r in records if r["task"].endswith("Note that the GPU checks wait for the reboot")]
    ladder.check("gpu_validate/driver not loaded: says the checks wait for the reboot, does not fail",
                 result.returncode == 0 and notes == ["localhost: the NVIDIA driver is not loaded yet (reboot pending); GPU checks skipped."],
                 str(notes))


# ------------------------------------------------------------------------------------------------ pytorch_env


def pytorch_env(ladder: Ladder, venv: Path) -> None:
    base = WORK / "pytorch-env"
    shutil.rmtree(base, ignore_errors=True)
    wheels, wheels_cpu_only = base / "wheels", base / "wheels-without-cu128"
    fake_wheels.build(wheels)
    fake_wheels.build(wheels_cpu_only, with_cuda_build=False)
    torch_venv = base / "venv"

    def play(label: str, wheel_dir: Path, target: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
        record = WORK / f"pytorch-{label}.jsonl"
        result = run([str(venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"fixtures_dir={HERE / 'fixtures'}",
                      "-e", f"torch_venv={target}", "-e", f"wheel_dir={wheel_dir}", "-e", "ansible_become=false", "pytorch_env.yml"],
                     ansible_env(venv, record), WORK / "logs" / f"pytorch-{label}.log")
        return result, ladder_lib.read_records(record)

    result, records = play("1", wheels, torch_venv)
    ladder.check("pytorch_env/builds the venv", result.returncode == 0, tail(result.stdout, 25))
    installed = subprocess.run([str(torch_venv / "bin" / "python"), "-c",
                                "import importlib.metadata as m; print(m.version('torch'), m.version('torchvision'), m.version('hpc-train'))"],
                               capture_output=True, text=True).stdout.split()
    ladder.check("pytorch_env/the +cu128 builds were chosen over +cpu and plain ones", installed == ["2.7.1+cu128", "0.22.1+cu128", "0.1.0"],
                 str(installed))
    result, records = play("2", wheels, torch_venv)
    ladder.check("pytorch_env/second run changes nothing", result.returncode == 0 and counts(records)[0] == 0,
                 "changed: " + ", ".join(r["task"] for r in records if r["changed"]))
    result, records = play("3", wheels_cpu_only, base / "venv-no-cuda")
    failure = ladder_lib.first_failure(records, "localhost") or {}
    ladder.check("pytorch_env/a mirror without the cu128 wheels: refused with a clear message",
                 failure.get("msg", "").startswith(f"pytorch_env: pip could not install torch==2.7.1+cu128 (and the rest of ")
                 and "must carry the cu128 wheels" in failure.get("msg", ""), failure.get("msg", ""))


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core-216", type=Path, required=True, help="venv with ansible-core 2.16 and ansible-lint")
    parser.add_argument("--core-current", type=Path, required=True, help="venv with the current ansible-core and ansible-lint")
    parser.add_argument("--only", nargs="*", default=None, help="run only these rungs (static, unit, check, converge, live, gpu_validate, pytorch_env)")
    args = parser.parse_args()
    args.core_216, args.core_current = args.core_216.absolute(), args.core_current.absolute()  # rungs change directory
    WORK.mkdir(parents=True, exist_ok=True)
    ladder = Ladder()
    venvs = {f"core-{core_version(args.core_216)}": args.core_216, f"core-{core_version(args.core_current)}": args.core_current}
    wanted = set(args.only or ["static", "unit", "check", "converge", "live", "gpu_validate", "pytorch_env"])
    core_216 = f"core-{core_version(args.core_216)}"

    # Two pipelines in parallel (the machine has 2 cores and each ansible-playbook here mostly uses one):
    # A: static, unit and check mode for both cores, gpu_validate, pytorch_env; B: converge, then live_change,
    # which needs the converged root.
    def pipeline_a() -> None:
        for label, venv in venvs.items():
            if "static" in wanted:
                with ladder.rung(f"static[{label}]"):
                    static(ladder, venv, label)
        if "unit" in wanted:
            with ladder.rung("unit"):
                unit(ladder, args.core_current)
        for label, venv in venvs.items():
            if "check" in wanted:
                with ladder.rung(f"check[{label}]"):
                    check_mode(ladder, venv, label)
        if "converge" in wanted:
            with ladder.rung(f"missing_branch[{core_216}]"):
                missing_branch(ladder, args.core_216)
        if "gpu_validate" in wanted:
            with ladder.rung(f"gpu_validate[{core_216}]"):
                gpu_validate(ladder, args.core_216)
        if "pytorch_env" in wanted:
            with ladder.rung(f"pytorch_env[{core_216}]"):
                pytorch_env(ladder, args.core_216)

    def pipeline_b() -> None:
        if "converge" in wanted:
            with ladder.rung(f"converge[{core_216}]"):
                converge(ladder, args.core_216)
        if "live" in wanted:
            with ladder.rung(f"live_change[{core_216}]"):
                live_change(ladder, args.core_216)

    threads = [threading.Thread(target=pipeline, name=pipeline.__name__) for pipeline in (pipeline_a, pipeline_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if ladder.failed:
        print("failed: " + "; ".join(ladder.failed))
    if os.environ.get("HPC_TRAIN_LADDER_START"):
        print(f"--- total: {time.time() - int(os.environ['HPC_TRAIN_LADDER_START']):.0f} s")
    print(f"{ladder.passed} passed, {len(ladder.failed)} failed")
    return 1 if ladder.failed else 0


if __name__ == "__main__":
    sys.exit(main())
