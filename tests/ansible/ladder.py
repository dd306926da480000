"""The Ansible test ladder (run by run.sh): every rung runs the real ansible-playbook / ansible-lint / dnf.

Rungs, each printed with its wall time:
  static[<core>]    ansible-lint --profile production (its syntax-check covers every playbook), per ansible-core
  unit              pytest: role templates against golden files, role rules, hpc_train.provision
  check[<core>]     gpu_nodes.yml --check --diff over EL7/EL8/EL9/Alma9/GH200/UEK fixtures and the negative fixtures,
                    per ansible-core; decisions, file diffs and exact failure messages from fixtures/check_expectations.yml
  converge          image_build.yml with dnf into an EL9 image root from fake repositories (rungs_packages.py):
                    converge, idempotence, verify (incl. the module built for the image's kernel), flavour switch
  missing_branch    refusals on a fresh root: a branch the mirror lacks, a kernel whose kernel-devel it lacks
  nccl_pin          an NCCL pin change on a root whose dnf honours the versionlock list (the old lock must not block it)
  live_change       the driver lifecycle on a live node (rungs_live.py): drain, change, reboot through Slurm, check,
                    resume; rollback 570 -> 550; unknown NodeName; kernel update; failed fabric manager
  live_kernel_moves a driver install whose transaction would bring a newer kernel-core (rungs_kernel.py; with the live
                    rung, on fresh roots: runs in pipeline C beside converge)
  secure_boot       Secure Boot's signed path on a live node (rungs_secure_boot.py): the site's enrolled key pair checked
                    (not enrolled, pending, mismatched: refused), DKMS signing with it, the module loading after the reboot
  gpu_validate      validate.yml against a stand-in nvidia-smi (rungs_nodes.py)
  pytorch_env       the pytorch_env role for real from stand-in wheels; docs/ansible.md's offline recipe
  real_slurm        site.yml --tags slurm against a real Slurm 22.05 (rungs_slurm.py): classic and configless
  real_slurm_newer  a site's Include files on a real Slurm 24.11 from tests/cluster's chroot (rungs_slurm_newer.py): the
                    duplicate NodeName refused, the site's keys kept, and without the refusal slurmctld does not start

Four pipelines run in parallel threads (see main). Every check prints PASS or FAIL; the last line is
"N passed, N failed". Usage:
    python ladder.py --core-216 VENV --core-current VENV [--only RUNG ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
import rungs_kernel  # noqa: E402
import rungs_live  # noqa: E402
import rungs_nodes  # noqa: E402
import rungs_packages  # noqa: E402
import rungs_secure_boot  # noqa: E402
import rungs_slurm  # noqa: E402
import rungs_slurm_newer  # noqa: E402
from ladder_lib import ANSIBLE, EXAMPLE, WORK, ansible_env, core_version, run, tail  # noqa: E402

PLAYBOOKS = ["site.yml", "gpu_nodes.yml", "validate.yml", "image_build.yml"]
RUNGS = ["static", "unit", "check", "converge", "live", "secure_boot", "gpu_validate", "pytorch_env", "real_slurm",
         "real_slurm_newer"]
# Slurm's running configuration in the check rung: what site.yml's controller play leaves (scontrol show config).
CHECK_SLURM_CONFIG = {"GresTypes": "gpu", "PropagateResourceLimits": "(null)", "PropagateResourceLimitsExcept": "MEMLOCK"}


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


# ------------------------------------------------------------------------------------------------ static


def static(ladder: Ladder, venv: Path, label: str) -> None:
    """ansible-lint --profile production, with this venv's ansible-core. Its syntax-check rule (core, unskippable)
    runs ansible-playbook --syntax-check on every playbook, so that is not run a second time."""
    result = run([str(venv / "bin" / "ansible-lint", ), "--offline", "--profile", "production", "--nocolor"], ansible_env(venv),
                 WORK / "logs" / f"lint-{label}.log", cwd=ANSIBLE)
    output = result.stdout + result.stderr
    ladder.check(f"static[{label}]/ansible-lint production, incl. --syntax-check of {', '.join(PLAYBOOKS)}",
                 result.returncode == 0 and "Passed" in output, tail(output, 30))


# ------------------------------------------------------------------------------------------------ unit


def unit(ladder: Ladder, venv: Path, core_216: Path) -> None:
    """pytest with the current core; test_target_python.py runs the roles' modules on Python 2.7/3.6 through core_216's
    ansible-playbook (2.19 no longer targets them)."""
    junit = WORK / "unit-junit.xml"
    junit.unlink(missing_ok=True)
    result = run([str(venv / "bin" / "python"), "-m", "pytest", "-c", str(HERE / "pytest.ini"), "-q", f"--junitxml={junit}",
                  "test_templates.py", "test_role_rules.py", "test_provision.py", "test_driver_facts.py", "test_slurm_conf_filters.py", "test_slurm_conf_read.py", "test_cuda_context.py", "test_target_python.py", "test_secure_boot_stand_ins.py"],
                 ansible_env(venv, HPC_TRAIN_CORE_216=str(core_216)), WORK / "logs" / "unit.log")
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
    expectations = yaml.safe_load((HERE / "fixtures" / "check_expectations.yml").read_text())
    assert set(expectations) == set(fixtures), "every fixture needs expectations"
    if newer:  # the driver-only fixtures (kernel flavours: the same Jinja as el9's) run on the EL8-capable core only
        fixtures = {host: fixture for host, fixture in fixtures.items() if "tags" not in fixture}
    for host, fixture in fixtures.items():
        ladder_lib.build_fixture_machine(fixture, check_root / host)
    # What each root holds before the run (its slurm.conf, a fixture's files): check mode must leave exactly that.
    before = {host: ladder_lib.tree(check_root / host / "root") for host in fixtures}
    slurm_state = ladder_lib.write_state(WORK / f"check-{label}-slurm.json", {"calls": [], "config": CHECK_SLURM_CONFIG})
    # Fixtures that only concern the driver (a "tags" key: the kernel flavours) run only preflight and the driver, in
    # a second run: the rest of the stack is the same as el9's.
    groups: dict[str, list[str]] = {}
    for host, fixture in fixtures.items():
        groups.setdefault(fixture.get("tags", "all"), []).append(host)
    records, outputs = [], []
    for tags, hosts in sorted(groups.items()):
        record = WORK / f"check-{label}-{tags.replace(',', '-')}.jsonl"
        env = ladder_lib.with_stand_ins(ansible_env(venv, record, HPC_TRAIN_FAKE_SLURM=str(slurm_state)), "fake_slurm")
        result = run([str(venv / "bin" / "ansible-playbook"), "-i", str(EXAMPLE), "-i", str(HERE / "inventories" / "check" / "hosts.yml"),
                      "--limit", ",".join(hosts), "-e", f"check_root={check_root}", "-e", f"fixtures_dir={HERE / 'fixtures'}",
                      # All fixture hosts in one batch: the rollout batching is Ansible's own serial, not under test.
                      "-e", '{"gpu_nodes_rollout_batches": ["100%"]}', "--tags", tags,
                      "--check", "--diff", "--skip-tags", "packages", "check_mode.yml"],
                     env, WORK / "logs" / f"check-{label}-{tags.replace(',', '-')}.log")
        records += ladder_lib.read_records(record)
        outputs.append(result.stdout + result.stderr)
    result_text = "\n".join(outputs)
    ladder.check(f"check[{label}]/ansible-playbook ran every fixture host", {r["host"] for r in records} == set(fixtures),
                 tail(result_text))
    for host, expect in expectations.items():
        if host not in fixtures:
            continue
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
        after = ladder_lib.tree(check_root / host / "root")
        ladder.check(f"{name}: check mode left the root untouched", after == before[host],
                     f"changed in check mode: {sorted(k for k in set(after) | set(before[host]) if after.get(k) != before[host].get(k))[:6]}")
    calls = json.loads(slurm_state.read_text())["calls"]
    ladder.check(f"check[{label}]/check mode only asked Slurm (scontrol show config), changed nothing there",
                 {tuple(c["argv"]) for c in calls} <= {("scontrol", "show", "config")} and calls, str(calls[:5]))


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core-216", type=Path, required=True, help="venv with ansible-core 2.16 and ansible-lint")
    parser.add_argument("--core-current", type=Path, required=True, help="venv with the current ansible-core and ansible-lint")
    parser.add_argument("--only", nargs="*", default=None, help=f"run only these rungs ({', '.join(RUNGS)})")
    args = parser.parse_args()
    args.core_216, args.core_current = args.core_216.absolute(), args.core_current.absolute()  # rungs change directory
    unknown = set(args.only or []) - set(RUNGS)
    if unknown:
        parser.error(f"unknown rungs {sorted(unknown)}; choose from {', '.join(RUNGS)}")
    WORK.mkdir(parents=True, exist_ok=True)
    ladder = Ladder()
    venvs = {f"core-{core_version(args.core_216)}": args.core_216, f"core-{core_version(args.core_current)}": args.core_current}
    wanted = set(args.only or RUNGS)
    core_216 = f"core-{core_version(args.core_216)}"

    # Four pipelines in parallel: the machine has 2 cores, and ansible-playbook waits a lot (dnf, polls, forks).
    # B: converge, then live_change, which needs the converged root: the longest chain, at full priority.
    # A: lint with the EL8-capable core, unit, check mode with both cores. C: lint with the current core, then the
    # rungs on fresh roots of their own. Both niced: B, converge then live_change, is the longest chain.
    (label_216, venv_216), (label_current, venv_current) = venvs.items()

    def pipeline_a() -> None:
        ladder_lib.set_niceness(10)
        if "static" in wanted:
            with ladder.rung(f"static[{label_216}]"):
                static(ladder, venv_216, label_216)
        if "unit" in wanted:
            with ladder.rung("unit"):
                unit(ladder, args.core_current, args.core_216)
        for label, venv in venvs.items():
            if "check" in wanted:
                with ladder.rung(f"check[{label}]"):
                    check_mode(ladder, venv, label)

    converged = threading.Event()  # secure_boot (pipeline D) starts from the converged root

    def pipeline_b() -> None:
        if "converge" in wanted:
            try:
                with ladder.rung(f"converge[{core_216}]"):
                    rungs_packages.converge(ladder, args.core_216)
            finally:
                converged.set()
        if "live" in wanted:
            with ladder.rung(f"live_change[{core_216}]"):
                rungs_live.live_change(ladder, args.core_216)

    def pipeline_c() -> None:
        ladder_lib.set_niceness(10)
        if "static" in wanted:
            with ladder.rung(f"static[{label_current}]"):
                static(ladder, venv_current, label_current)
        steps = [("converge", "missing_branch", rungs_packages.missing_branch), ("converge", "nccl_pin", rungs_packages.nccl_pin_change),
                 ("live", "live_kernel_moves", rungs_kernel.kernel_moves),
                 ("gpu_validate", "gpu_validate", rungs_nodes.gpu_validate), ("pytorch_env", "pytorch_env", rungs_nodes.pytorch_env)]
        for rung, name, function in steps:
            if rung in wanted:
                with ladder.rung(f"{name}[{core_216}]"):
                    function(ladder, args.core_216)

    # D: the real Slurm; it waits on its daemons (start-up, health check intervals, jobs) as much as it computes, so
    # it runs a little below B but above A and C. 22.05, then 24.11: one cluster at a time (the same namespaces); then
    # secure_boot, which uses no cluster.
    def pipeline_d() -> None:
        ladder_lib.set_niceness(5)
        if "real_slurm" in wanted:
            with ladder.rung(f"real_slurm[{core_216}]"):
                rungs_slurm.real_slurm(ladder, args.core_216)
        if "real_slurm_newer" in wanted:
            with ladder.rung(f"real_slurm_newer[{core_216}]"):
                rungs_slurm_newer.real_slurm_newer(ladder, args.core_216)
        if "secure_boot" in wanted:
            # Last in D, from converge's root (long built by then): C carries live_kernel_moves, and D's real Slurm rungs
            # end well before A's check rungs, so here it lengthens no pipeline past A.
            if "converge" in wanted:
                converged.wait()
            with ladder.rung(f"secure_boot[{core_216}]"):
                rungs_secure_boot.secure_boot_rung(ladder, args.core_216)

    threads = [threading.Thread(target=pipeline, name=pipeline.__name__)
               for pipeline in (pipeline_a, pipeline_b, pipeline_c, pipeline_d)]
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
