"""The preamble: every job value the script uses, assigned once to a read-only variable, each one shell word.

``readonly HT_NAME='my run'``, ``readonly -a HT_MODULES=('cuda/12.4' 'nccl')``, ``readonly HT_NODES=4``: the
template reads ``"$HT_NAME"``, ``"${HT_MODULES[@]}"``, and no job text is ever part of the script's code. A string
is ``shlex.quote``d (one word, whatever it holds: quotes, ``$( )``, newlines); an integer is written bare only when
Python holds an ``int`` (a schema int, checked here), so a variable a template uses in ``$(( ))`` never holds text
for bash to evaluate. Only the variables the rendered script reads are written (no unused-variable noise for
shellcheck); one it reads that hpc-train does not assign is refused, naming the template file.

What the rule cannot see: a template that runs a variable as code (``eval "$HT_NAME"``, ``bash -c "$HT_NAME"``)
runs data as code by its own choice, as a GitHub workflow that ``eval``s ``$TITLE`` does; that is the template's
code, and the admin's to review.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any, Iterable, Mapping

from ..config import JobSpec, SlurmConfig

PREFIX = "HT_"
_USED = re.compile(r"\bHT_[A-Z0-9_]+\b")

# What a {{ }} of the old templates printed, and the variable that holds it now (for the refusal's message).
_FIXED = {
    "job.name": "HT_NAME", "job.runs_dir": "HT_RUNS_DIR", "runs_root": "HT_RUNS_ROOT", "run_group": "HT_RUN_GROUP",
    "python": "HT_PYTHON", "job_yaml": "HT_JOB_YAML", "job_yaml_eof": "HT_JOB_YAML", "text": "@HT_POINT_YAMLS",
    "array_yamls": "@HT_POINT_YAMLS", "sweep_points": "HT_SWEEP_POINTS", "launch.run_dir": "HT_CONTINUE_RUN_DIR",
    "launch.points_dir": "HT_POINTS_DIR", "launch.sweep_id": "HT_SWEEP_ID", "launch.point_offset": "HT_POINT_OFFSET",
    "launch.task_stdout": "HT_TASK_STDOUT", "launch.task_stderr": "HT_TASK_STDERR",
    "launch.command": "@HT_LAUNCH_COMMAND", "job.command": "@HT_COMMAND", "container_binds": "@HT_CONTAINER_BINDS",
    "job.slurm.container.image": "HT_CONTAINER_IMAGE", "job.slurm.venv": "HT_VENV_ACTIVATE",
    "job.slurm.sbatch_tasks_per_node": "HT_SBATCH_TASKS_PER_NODE",
    "job.slurm.sbatch_cpus_per_task": "HT_SBATCH_CPUS_PER_TASK", "job.slurm.ranks_per_node": "HT_RANKS_PER_NODE",
    "job.slurm.world_size": "HT_WORLD_SIZE", "job.slurm.python": "HT_PYTHON",
}


def _scalar_fields() -> dict[str, str]:
    """``job.slurm.<field>`` -> ``HT_<FIELD>`` for each field that is a value, not a choice of structure (a bool) or
    a table (``env``, ``extra_sbatch``, ``container``); tuples are arrays (``@``)."""
    found = {}
    defaults = SlurmConfig()
    for f in dataclasses.fields(SlurmConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, bool) or isinstance(value, Mapping) or f.name in ("container", "python"):
            continue
        found[f"job.slurm.{f.name}"] = ("@" if isinstance(value, tuple) else "") + PREFIX + f.name.upper()
    return found


EXPRESSIONS = {**_scalar_fields(), **_FIXED}


def variable_for(expression: str) -> str | None:
    """The variable (``@`` before an array's name) a ``{{ expression }}`` of a template should read, if any; for
    ``job.slurm.env.X``, the exported ``X``."""
    match = re.match(r"[\s(]*([A-Za-z_][\w.]*)", expression)
    if match is None:
        return None
    path = match.group(1)
    if path.startswith("job.slurm.env."):
        return path.removeprefix("job.slurm.env.")
    return EXPRESSIONS.get(path)


def _word(value: Any) -> str:
    if type(value) is int:  # a schema int: safe bare, and what an arithmetic $(( )) may read
        return str(value)
    if isinstance(value, (bool, float)) or not isinstance(value, (str, type(None))):
        raise TypeError(f"a script variable holds text, an int or a list of text, not {value!r}")
    return shlex.quote("" if value is None else value)


def assignment(name: str, value: Any) -> str:
    """One ``readonly`` line: ``NAME=word`` or, for a list, ``-a NAME=(word ...)``."""
    if isinstance(value, (list, tuple)):
        return f"readonly -a {name}=({' '.join(shlex.quote(str(v)) for v in value)})"
    return f"readonly {name}={_word(value)}"


def job_values(spec: JobSpec, *, runs_root: str, run_group: str, python: str, launch: Any, job_yaml: str,
               point_yamls: list[str], sweep_points: int, container_binds: list[str]) -> dict[str, Any]:
    """Every value a script may read, by variable name, in the preamble's order (the job YAML last: it is long)."""
    s = spec.slurm
    values: dict[str, Any] = {"HT_NAME": spec.name, "HT_RUNS_DIR": spec.runs_dir, "HT_RUNS_ROOT": runs_root,
                              "HT_RUN_GROUP": run_group, "HT_PYTHON": python}
    for expression, name in _scalar_fields().items():
        values[name.lstrip("@")] = getattr(s, expression.removeprefix("job.slurm."))
    values.update({
        "HT_SBATCH_TASKS_PER_NODE": s.sbatch_tasks_per_node, "HT_SBATCH_CPUS_PER_TASK": s.sbatch_cpus_per_task,
        "HT_RANKS_PER_NODE": s.ranks_per_node, "HT_WORLD_SIZE": s.world_size,
        "HT_VENV_ACTIVATE": f"{s.venv}/bin/activate" if s.venv else None,
        "HT_COMMAND": spec.command,
        "HT_SRUN_OPTIONS": srun_options(spec, container_binds),
        "HT_CONTAINER_IMAGE": s.container.image if s.container else None,
        "HT_CONTAINER_BINDS": container_binds,
        "HT_CONTAINER_EXEC": container_exec(spec, container_binds),
        "HT_CONTINUE_RUN_DIR": launch.run_dir, "HT_POINTS_DIR": launch.points_dir, "HT_SWEEP_ID": launch.sweep_id,
        "HT_POINT_OFFSET": launch.point_offset, "HT_SWEEP_POINTS": sweep_points,
        "HT_TASK_STDOUT": launch.task_stdout, "HT_TASK_STDERR": launch.task_stderr,
        # submitit's `python -u -m submitit.core._submit <folder>`, shell text it quoted itself: its words.
        "HT_LAUNCH_COMMAND": shlex.split(launch.command),
        "HT_POINT_COUNT": len(point_yamls), "HT_POINT_YAMLS": point_yamls,
        "HT_JOB_YAML": job_yaml,
    })
    return values


def srun_options(spec: JobSpec, container_binds: list[str]) -> list[str]:
    """The srun options every launch passes: CPU binding, the pyxis container, the job's own srun_args (the
    container's working directory, ``$PWD`` at run time, is the template's)."""
    s = spec.slurm
    words = [f"--cpu-bind={s.cpu_bind}"] if s.cpu_bind else []
    if s.container is not None and s.container.runtime == "pyxis":
        words += [f"--container-image={s.container.image}", f"--container-mounts={','.join(container_binds)}"]
    return [*words, *s.srun_args]


def container_exec(spec: JobSpec, container_binds: list[str]) -> list[str]:
    """``apptainer exec --nv --bind B ... IMAGE``, the words before the ranks' command (apptainer only)."""
    c = spec.slurm.container
    if c is None or c.runtime != "apptainer":
        return []
    return ["apptainer", "exec", "--nv", *[w for bind in container_binds for w in ("--bind", bind)], c.image]


def used_names(text: str) -> set[str]:
    return set(_USED.findall(text))


def preamble(values: Mapping[str, Any], used: Iterable[str]) -> str:
    """The ``readonly`` lines of the variables the script reads, in the catalogue's order."""
    wanted = set(used)
    lines = []
    for name, value in values.items():
        if name in wanted:
            line = assignment(name, value)
            if "$" in line or "`" in line:  # shellcheck's hint for code in single quotes: here it is data, meant so
                lines.append("# shellcheck disable=SC2016")
            lines.append(line)
    if not lines:
        return ""
    return ("# The job's values, each one shell word in a read-only variable (hpc_train/render/variables.py): the\n"
            "# script below reads them and never holds job text as code.\n" + "\n".join(lines) + "\n")


def exports(env: Mapping[str, str]) -> str:
    """``export KEY='value'`` for the job's ``slurm.env`` (keys are checked names: hpc_train/config/validate.py)."""
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(env.items()))
