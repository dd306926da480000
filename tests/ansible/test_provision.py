"""hpc_train.provision: argv/environment building, clear errors, and one real ansible-playbook run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from hpc_train import provision as prov  # noqa: E402
from hpc_train.errors import HpcTrainError, ProvisionError  # noqa: E402

EXAMPLE = REPO / "ansible" / "inventories" / "example"


def test_ansible_dir_is_the_source_tree_ansible() -> None:
    assert prov.ansible_dir() == REPO / "ansible"
    assert {"site.yml", "gpu_nodes.yml", "validate.yml", "image_build.yml"} <= set(prov.playbooks())


def test_command_uses_the_project_config_and_passes_options_through(tmp_path: Path) -> None:
    argv, env = prov.build_command(EXAMPLE, check=True, limit="gpu01", tags="driver,cuda", playbook="gpu_nodes.yml",
                                   extra_args=["-e", "nvidia_driver_allow_change=true"], ansible_playbook=Path("/x/ansible-playbook"),
                                   environ={"KEEP": "1"}, cwd=tmp_path)
    assert argv == ["/x/ansible-playbook", "-i", str(EXAMPLE), str(REPO / "ansible" / "gpu_nodes.yml"), "--check", "--diff",
                    "--limit", "gpu01", "--tags", "driver,cuda", "-e", "nvidia_driver_allow_change=true"]
    assert env["ANSIBLE_CONFIG"] == str(REPO / "ansible" / "ansible.cfg")
    assert env["KEEP"] == "1"


def test_a_sites_own_ansible_config_is_respected(tmp_path: Path) -> None:
    """ANSIBLE_CONFIG set by the site, or an ansible.cfg in the current directory, wins over the project's."""
    _, env = prov.build_command(EXAMPLE, ansible_playbook=Path("/x/ansible-playbook"),
                                environ={"ANSIBLE_CONFIG": str(tmp_path / "site.cfg")}, cwd=tmp_path)
    assert env["ANSIBLE_CONFIG"] == str(tmp_path / "site.cfg")
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 50\n")
    _, env = prov.build_command(EXAMPLE, ansible_playbook=Path("/x/ansible-playbook"), environ={}, cwd=tmp_path)
    assert "ANSIBLE_CONFIG" not in env


def test_the_playbooks_work_with_a_sites_config_without_become(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    """A site ansible.cfg has no roles_path or become: the plays find their roles and become root themselves."""
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 5\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    code = prov.provision(EXAMPLE, playbook="site.yml", limit="gpu01", extra_args=["--list-tasks"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "nvidia_driver : " in out and "gpu_preflight : " in out
    plays = [play for name in ("gpu_nodes.yml", "validate.yml", "image_build.yml")
             for play in yaml.safe_load((REPO / "ansible" / name).read_text())]
    # Every play that changes or reads root-owned state becomes root; the srun check runs as the login user.
    assert [play["name"] for play in plays if play.get("become") is not True] == ["Check that Slurm hands out GPUs"]


def test_missing_ansible_playbook_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ProvisionError) as caught:
        prov.provision(EXAMPLE)
    assert "pip install 'hpc-train[ansible]'" in str(caught.value)
    assert caught.value.exit_code == 2 and isinstance(caught.value, HpcTrainError)


def test_missing_inventory(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match=r"inventory .*nope does not exist; copy .*inventories/example"):
        prov.build_command(tmp_path / "nope", ansible_playbook=Path("/x/ansible-playbook"))


def test_unknown_playbook_lists_the_known_ones() -> None:
    with pytest.raises(ProvisionError, match=r"unknown playbook 'deploy.yml'; choose one of: gpu_nodes.yml, image_build.yml, site.yml, validate.yml"):
        prov.build_command(EXAMPLE, playbook="deploy.yml", ansible_playbook=Path("/x/ansible-playbook"))


def test_real_run_lists_the_hosts_of_the_limit(capfd: pytest.CaptureFixture[str]) -> None:
    """A real ansible-playbook (this venv's) with the project's config: --limit reaches it, nothing connects."""
    code = prov.provision(EXAMPLE, playbook="gpu_nodes.yml", limit="gpu02", extra_args=["--list-hosts"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "gpu02" in out and "gpu01" not in out and "gpu03" not in out


def test_real_run_returns_ansible_playbooks_exit_code(capfd: pytest.CaptureFixture[str]) -> None:
    code = prov.provision(EXAMPLE, playbook="site.yml", limit="no-such-host", extra_args=["--list-hosts"])
    captured = capfd.readouterr()
    assert code != 0
    assert "no hosts" in captured.out + captured.err
