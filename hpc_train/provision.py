"""``hpc-train provision``: run the project's Ansible playbooks (with the project's ansible.cfg unless the site has one).

The playbooks and roles live in ``ansible/`` (``hpc_train/_data/ansible`` in an installed wheel, see
:mod:`hpc_train.resources`). ansible-core is an optional extra (``pip install 'hpc-train[ansible]'``,
pinned to 2.16 because later releases cannot manage EL7/EL8); nothing here imports Ansible, torch or click.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ProvisionError
from .resources import ansible_dir

INSTALL_HINT = "install the extra: pip install 'hpc-train[ansible]'"


def find_ansible_playbook() -> Path:
    """The ansible-playbook next to this Python (same venv, even if not activated), else the one on PATH."""
    beside_python = Path(sys.executable).parent / "ansible-playbook"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which("ansible-playbook")
    if found is None:
        raise ProvisionError(f"ansible-playbook was not found (ansible-core is not installed); {INSTALL_HINT}")
    return Path(found)


def playbooks(directory: Path | None = None) -> list[str]:
    """The playbooks `provision` can run: the top-level *.yml files of the ansible directory."""
    directory = directory or ansible_dir()
    return sorted(p.name for p in directory.glob("*.yml"))


def build_command(
    inventory: Path,
    *,
    check: bool = False,
    limit: str | None = None,
    tags: str | None = None,
    playbook: str = "site.yml",
    extra_args: Sequence[str] = (),
    ansible_playbook: Path | None = None,
    directory: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ansible-playbook argv and environment for one run; raises ProvisionError on bad input.

    ANSIBLE_CONFIG points at the project's ansible.cfg unless the site chose its own: ANSIBLE_CONFIG already set, or
    an ansible.cfg in the current directory (``cwd``), the first two places Ansible itself looks.
    """
    directory = directory or ansible_dir()
    config = directory / "ansible.cfg"
    if not config.is_file():
        raise ProvisionError(f"the Ansible tree is incomplete: {config} is missing; reinstall hpc-train")
    if not inventory.exists():
        raise ProvisionError(
            f"inventory {inventory} does not exist; copy {directory / 'inventories' / 'example'} and edit it"
        )
    known = playbooks(directory)
    if playbook not in known:
        raise ProvisionError(f"unknown playbook {playbook!r}; choose one of: {', '.join(known)}")
    executable = ansible_playbook or find_ansible_playbook()
    argv = [str(executable), "-i", str(inventory.resolve()), str(directory / playbook)]
    if check:
        argv += ["--check", "--diff"]
    if limit:
        argv += ["--limit", limit]
    if tags:
        argv += ["--tags", tags]
    argv += list(extra_args)
    env = dict(os.environ if environ is None else environ)
    # ~/.ansible.cfg and /etc/ansible/ansible.cfg are personal or system defaults, not a site's choice for these
    # playbooks, so they do not count. The playbooks set become themselves and find their roles next to them, so
    # they also work with a site's ansible.cfg.
    site_config = Path.cwd() if cwd is None else cwd
    if not env.get("ANSIBLE_CONFIG") and not (site_config / "ansible.cfg").is_file():
        env["ANSIBLE_CONFIG"] = str(config)
    return argv, env


def provision(inventory: Path, **options: Any) -> int:
    """Run a playbook from the project's ansible/ directory against ``inventory``; return its exit code.

    ``options`` are :func:`build_command`'s: ``check`` adds ``--check --diff``; ``limit`` and ``tags`` pass
    through; ``extra_args`` are appended as they are (``-e nvidia_driver_allow_change=true``, ``-vv`` ...).
    Output goes to this process's stdout/stderr. Raises :class:`ProvisionError` (exit 2) when
    ansible-playbook, the inventory or the playbook is missing.
    """
    argv, env = build_command(Path(inventory), **options)
    try:
        return subprocess.run(argv, env=env, check=False).returncode
    except OSError as exc:  # e.g. a broken venv: the script exists but its interpreter does not
        raise ProvisionError(f"could not run {argv[0]}: {exc.strerror}; {INSTALL_HINT}") from None
