"""The script's header, written by Python: the comment lines that describe the job, then the ``#SBATCH`` lines, each
from the field that declares it (hpc_train/config/slurm_options.py), the launch's log paths and array, and the
job's ``slurm.extra_sbatch``."""

from __future__ import annotations

import shlex
from typing import Any

from .. import __version__
from ..config import JobSpec, SlurmConfig
from ..config.slurm_options import sbatch_options, sbatch_text
from ..errors import TemplateError


def sbatch_value(value: Any) -> str:
    """A value on an ``#SBATCH`` line: quoted like a shell word, which sbatch's own option reader unquotes too,
    with each backslash doubled (sbatch reads one as an escape, inside quotes as well); a newline cannot be
    carried at all (the rest would become a shell command), so it is refused."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise TemplateError(f"a value on an #SBATCH line contains a newline: {text!r}; remove it")
    return shlex.quote(text.replace("\\", "\\\\"))


def sbatch_line(option: str) -> str:
    """``#SBATCH --name=value`` with the value quoted (``--name`` alone for a flag)."""
    name, equals, value = option.partition("=")
    return f"#SBATCH {name}={sbatch_value(value)}" if equals else f"#SBATCH {name}"


def comment(value: Any) -> str:
    """Text for a ``#`` comment line: on one line, and quoted when it is not a plain word."""
    return shlex.quote(" ".join(str(value).split()))


def describe(spec: JobSpec, template_name: str) -> list[str]:
    """The comment lines at the top: what the script is, the job's shape, and what the ranks run."""
    from ..config.sync_bn import decide

    s = spec.slurm
    lines = [f"# {comment(spec.name)}: rendered by hpc-train {__version__} from {template_name}",
             f"# {s.nodes} node(s) x {s.ranks_per_node} rank(s) = {s.world_size} rank(s), launcher {s.launcher}"]
    if spec.command:
        lines.append("# Every rank runs the job's command (job.yaml's `command`, never through a shell): "
                     + comment(" ".join(spec.command)))
    else:
        lines.append("# BatchNorm: " + " ".join(decide(spec.train, s.world_size).describe().split()))
    return lines


def sbatch_lines(spec: JobSpec, launch: Any) -> list[str]:
    """Every ``#SBATCH`` line: the fields' (in field order), the launch's, then ``slurm.extra_sbatch``'s."""
    options = [sbatch_text(name, declared, spec) for name, declared in sbatch_options(JobSpec)]
    options += [sbatch_text(name, declared, spec.slurm) for name, declared in sbatch_options(SlurmConfig)]
    options += [f"--output={launch.stdout}", f"--error={launch.stderr}", "--open-mode=append"]
    if launch.array:
        options.append(f"--array={launch.array}")
    for key, value in sorted(spec.slurm.extra_sbatch.items()):
        if value is True:
            options.append(f"--{key}")
        elif value is not False and value is not None:
            options.append(f"--{key}={value}")
    return [sbatch_line(option) for option in options if option is not None]


def header(spec: JobSpec, launch: Any, template_name: str) -> str:
    return "\n".join([*describe(spec, template_name), *sbatch_lines(spec, launch)]) + "\n"
