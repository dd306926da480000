"""templates, jobs, provision: what ships with hpc-train (templates, example jobs, Ansible playbooks)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Callable

import click

from ..errors import ConfigError
from .group import CONTEXT, Group, cli


def _export_tree(source: Path, dest: Path, force: bool) -> list[Path]:
    """Copy a shipped tree; refuse (before writing anything) to overwrite unless ``force``; a copy that
    fails half-way removes what it wrote."""
    from ..runs.undo import Created

    files = sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    clashes = [dest / p.relative_to(source) for p in files if (dest / p.relative_to(source)).exists()]
    if clashes and not force:
        raise ConfigError(f"{clashes[0]} already exists ({len(clashes)} file(s) would be overwritten); "
                          "choose an empty directory or pass --force")
    created = Created()
    for path in files:
        target = dest / path.relative_to(source)
        created.mkdir(target.parent, hint="choose a directory you can write to")
        created.write(target, path.read_text(encoding="utf-8"))
        shutil.copymode(path, target)
    return [dest / p.relative_to(source) for p in files]


@cli.group(cls=Group, context_settings=CONTEXT)
def templates() -> None:
    """List, show and export the sbatch templates (site directories first, then ours).

    \b
    Examples:
      hpc-train templates list
      hpc-train templates show default.sbatch.j2
      hpc-train templates export /etc/hpc-train/templates   # then edit, and list the dir in the site file
    """


def _site_dirs() -> tuple[Path, ...]:
    from ..config import load_site

    return load_site().template_dirs


@templates.command("list", context_settings=CONTEXT)
def templates_list() -> None:
    """List the templates and partials, which file wins on the search path, and what it overrides."""
    from ..render import list_templates, search_path

    site_dirs = _site_dirs()
    for name, path, overridden in list_templates(site_dirs):
        click.echo(f"{name}  {path}" + (f"  (overrides {', '.join(map(str, overridden))})" if overridden else ""))
    click.echo("search path: " + ", ".join(str(d) for d in search_path(site_dirs)), err=True)


@templates.command("show", context_settings=CONTEXT)
@click.argument("name", default="default.sbatch.j2")
def templates_show(name: str) -> None:
    """Print a template's source (partials too, e.g. partials/bootstrap.j2)."""
    from ..render import template_source

    path, text = template_source(name, _site_dirs())
    click.echo(f"# {path}", err=True)
    click.echo(text, nl=False)


@cli.group(cls=Group, context_settings=CONTEXT)
def jobs() -> None:
    """List, show and export the example job files.

    \b
    Examples:
      hpc-train jobs list
      hpc-train jobs show cifar10_lt_ldam_drw
      hpc-train jobs export my-jobs/
    """


def _job_description(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


@jobs.command("list", context_settings=CONTEXT)
def jobs_list() -> None:
    """List the shipped example jobs."""
    from ..resources import jobs_dir

    paths = sorted(jobs_dir().glob("*.yaml"))
    width = max((len(p.stem) for p in paths), default=0)
    for path in paths:
        click.echo(f"{path.stem.ljust(width)}  {_job_description(path)}".rstrip())


@jobs.command("show", context_settings=CONTEXT)
@click.argument("name")
def jobs_show(name: str) -> None:
    """Print an example job file."""
    from ..resources import jobs_dir

    path = jobs_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")
    if "/" in name or not path.is_file():
        known = ", ".join(p.stem for p in sorted(jobs_dir().glob("*.yaml")))
        raise ConfigError(f"no example job {name!r}; known: {known}")
    click.echo(path.read_text(encoding="utf-8"), nl=False)


def _export_command(group: click.Group, help_text: str, source: Callable[[], Path], done: str) -> None:
    """``templates export`` and ``jobs export``: the same command over another shipped tree."""

    @group.command("export", context_settings=CONTEXT, help=help_text)
    @click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
    @click.option("--force", is_flag=True, help="Overwrite files that exist.")
    def export(directory: Path, force: bool) -> None:
        written = _export_tree(source(), directory, force)
        click.echo(f"exported {len(written)} {done.format(directory=directory)}")


def _templates_dir() -> Path:
    from ..resources import templates_dir

    return templates_dir()


def _jobs_dir() -> Path:
    from ..resources import jobs_dir

    return jobs_dir()


_export_command(templates, "Copy our templates (and partials) to DIRECTORY, to start a site's own.", _templates_dir,
                "file(s) to {directory}; add it to the site file's template_dirs")
_export_command(jobs, "Copy the example jobs to DIRECTORY.", _jobs_dir, "job file(s) to {directory}")


@cli.command(context_settings=CONTEXT)
@click.option("--inventory", "-i", required=True, type=click.Path(path_type=Path), envvar="HPC_TRAIN_INVENTORY",
              show_envvar=True, help="Ansible inventory (file or directory).")
@click.option("--check", is_flag=True, help="Dry run: report what would change (ansible --check --diff).")
@click.option("--limit", "-l", help="Only these hosts/groups (ansible --limit).")
@click.option("--tags", help="Only these tags (ansible --tags).")
@click.option("--playbook", default="site.yml", show_default=True, help="Playbook under ansible/.")
@click.option("--extra-vars", "-e", "extra_vars", multiple=True, metavar="KEY=VALUE",
              help="Passed to ansible-playbook -e (repeatable), e.g. -e nvidia_driver_allow_change=true.")
def provision(inventory: Path, check: bool, limit: str | None, tags: str | None, playbook: str,
              extra_vars: tuple[str, ...]) -> None:
    """Install the NVIDIA driver, CUDA, NCCL and PyTorch on EL GPU nodes and make them Slurm GPU nodes.

    Runs ansible-playbook with the project's ansible.cfg unless the site has its own ($ANSIBLE_CONFIG, or an
    ./ansible.cfg here); needs the 'ansible' extra.

    \b
    Examples:
      hpc-train provision -i inventories/prod --check
      hpc-train provision -i inventories/prod --limit gpu_nodes --tags driver
      hpc-train provision -i inventories/prod --limit gpu07 -e nvidia_driver_allow_change=true
    """
    from ..provision import provision as run_provision

    extra_args = [arg for value in extra_vars for arg in ("-e", value)]
    code = run_provision(inventory, check=check, limit=limit, tags=tags, playbook=playbook, extra_args=extra_args)
    if code:
        sys.exit(1)
