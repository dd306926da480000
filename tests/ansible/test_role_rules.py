"""Project rules for the roles that ansible-lint does not check (see docs/ansible.md, "Role conventions")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ANSIBLE = Path(__file__).resolve().parent.parent.parent / "ansible"
ROLES = sorted(p for p in (ANSIBLE / "roles").iterdir() if p.is_dir())
TASK_KEYWORDS = {
    "name", "when", "tags", "register", "loop", "loop_control", "vars", "block", "rescue", "always", "notify", "become",
    "changed_when", "failed_when", "check_mode", "environment", "until", "retries", "delay", "args", "listen",
    "run_once", "delegate_to", "ignore_errors", "no_log", "timeout", "with_items", "diff", "throttle", "any_errors_fatal",
}
# A comparison applied to the release without "| int": '10' < '8' is True for strings.
STRING_RELEASE_COMPARE = re.compile(r"distribution_major_version(?:'\])?\s*(?:==|!=|<=|>=|<|>|in\b)")


def task_files(role: Path) -> list[Path]:
    return sorted((role / "tasks").glob("*.yml")) + sorted((role / "handlers").glob("*.yml"))


def iter_tasks(tasks: list) -> list[dict]:
    found = []
    for task in tasks or []:
        found.append(task)
        for key in ("block", "rescue", "always"):
            found += iter_tasks(task.get(key, []))
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_has_the_standard_files(role: Path) -> None:
    for relative in ("defaults/main.yml", "meta/main.yml", "meta/argument_specs.yml", "tasks/main.yml", "README.md"):
        assert (role / relative).is_file(), f"{role.name} lacks {relative}"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_defaults_and_argument_specs_agree(role: Path) -> None:
    defaults = set(yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {})
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    documented = set().union(*(set(entry.get("options", {})) for entry in specs.values()))
    assert defaults - documented == set(), f"{role.name}: defaults without an argument spec"
    assert documented - defaults == set(), f"{role.name}: argument specs without a default"
    assert all(name.startswith(role.name + "_") for name in defaults), f"{role.name}: a default lacks the role prefix"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_readme_documents_every_default(role: Path) -> None:
    readme = (role / "README.md").read_text()
    missing = [name for name in yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {} if name not in readme]
    assert missing == [], f"{role.name}/README.md does not mention {missing}"


# Modules the roles ship themselves (roles/<role>/library/, inside the wheel with the roles).
ROLE_MODULES = {path.stem for path in (ANSIBLE / "roles").glob("*/library/*.py")}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_only_builtin_modules(role: Path) -> None:
    """Galaxy is unreachable on many sites: every module must come with ansible-core itself, or with the roles."""
    for path in task_files(role):
        for task in iter_tasks(yaml.safe_load(path.read_text())):
            if "block" in task:
                continue
            modules = [key for key in task if key not in TASK_KEYWORDS]
            assert len(modules) == 1, f"{path}: cannot tell the module of task {task.get('name')}: {modules}"
            assert modules[0].startswith("ansible.builtin.") or modules[0] in ROLE_MODULES, \
                f"{path}: {modules[0]} is neither an ansible.builtin module nor one of the roles' own ({sorted(ROLE_MODULES)})"


def test_role_modules_are_read_only_and_documented() -> None:
    """A role's own module runs in check mode and changes nothing (the roles' changes go through ansible.builtin)."""
    assert ROLE_MODULES, "no role module found"
    for path in (ANSIBLE / "roles").glob("*/library/*.py"):
        text = path.read_text()
        assert "supports_check_mode=True" in text and "changed=False" in text and "DOCUMENTATION = " in text, path


def test_release_compare_rule_catches_string_comparisons() -> None:
    assert STRING_RELEASE_COMPARE.search("when: ansible_distribution_major_version < '8'")
    assert STRING_RELEASE_COMPARE.search("that: ansible_facts['distribution_major_version'] == '9'")
    assert not STRING_RELEASE_COMPARE.search("that: ansible_facts['distribution_major_version'] | int >= 8")


def test_releases_are_compared_as_integers() -> None:
    offenders = [
        f"{path.relative_to(ANSIBLE)}:{number}: {line.strip()}"
        for path in sorted(ANSIBLE.rglob("*.yml")) + sorted(ANSIBLE.rglob("*.j2"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if STRING_RELEASE_COMPARE.search(line)
    ]
    assert offenders == []


def test_reboots_are_opt_in_after_a_drain_and_a_built_module() -> None:
    """Every way to reboot (the reboot module, Slurm's `scontrol reboot`) is in nvidia_driver's reboot.yml, which only
    finish.yml includes: inside the block guarded by nvidia_driver_reboot, after the drain and the check that the
    kernel module is built."""
    with_reboots = sorted({str(path.relative_to(ANSIBLE)) for role in ROLES for path in task_files(role)
                           if "ansible.builtin.reboot" in path.read_text() or re.search(r"scontrol, reboot|'scontrol', 'reboot'", path.read_text())})
    assert with_reboots == ["roles/nvidia_driver/tasks/reboot.yml"]
    includes = [(path, task) for role in ROLES for path in task_files(role) for task in yaml.safe_load(path.read_text()) or []
                for inner in iter_tasks([task]) if str(inner.get("ansible.builtin.include_tasks", "")).startswith("reboot")]
    assert len(includes) == 1 and includes[0][0].name == "finish.yml"
    block = includes[0][1]
    assert "nvidia_driver_reboot | bool" in block["when"]
    names = [t.get("name", "") for t in block["block"]]
    assert names.index("Drain the node before the reboot") < names.index("Refuse to reboot into a kernel without the module") < names.index("Reboot")
    defaults = yaml.safe_load((ANSIBLE / "roles" / "nvidia_driver" / "defaults" / "main.yml").read_text())
    assert defaults["nvidia_driver_reboot"] is False


def test_no_collections_are_required() -> None:
    assert not (ANSIBLE / "requirements.yml").exists() and not (ANSIBLE / "collections").exists()


def test_classic_slurm_conf_hosts_get_the_keys(tmp_path: Path) -> None:
    """Every host that reads a slurm.conf of its own gets the keys and the NodeName file (classic Slurm): besides the
    login and GPU nodes, the hosts of group slurm_gpu_node_conf_hosts (CPU-only nodes, other submit hosts), which
    the example inventory defines empty. Asked of ansible-playbook --list-hosts, the plays' own host patterns."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "controller": {"hosts": {"ctl": None}}, "login": {"hosts": {"login1": None}},
        "gpu_nodes": {"hosts": {"gpu1": None}}, "slurm_gpu_node_conf_hosts": {"hosts": {"cpu1": None, "submit2": None}}}}}))
    result = subprocess.run(["ansible-playbook", "-i", str(inventory), "--list-hosts", str(ANSIBLE / "gpu_nodes.yml")],
                            capture_output=True, text=True, cwd=ANSIBLE)
    assert result.returncode == 0, result.stderr
    plays = {}
    for block in re.split(r"\n(?=  play #)", result.stdout):
        name = re.search(r"play #\d+ \([^)]*\): (.*?)\s+TAGS:", block)
        if name:
            plays[name.group(1)] = set(re.findall(r"^\s{6}(\S+)$", block, re.M))
    classic = [hosts for name, hosts in plays.items() if "slurm.conf keys" in name or "Restart slurmd" in name]
    assert len(classic) == 2 and all(hosts == {"login1", "gpu1", "cpu1", "submit2"} for hosts in classic), plays
    assert plays["Install the NVIDIA driver, one batch of nodes at a time"] == {"gpu1"}
    example = yaml.safe_load((ANSIBLE / "inventories" / "example" / "hosts.yml").read_text())
    assert "slurm_gpu_node_conf_hosts" in example["all"]["children"]
