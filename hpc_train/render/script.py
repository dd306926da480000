"""The pure ``render_sbatch``: a job in, the sbatch script's text out (no Slurm, no submitit, nothing written).

Two forms share one template (docs/design.md, decision 1):

* ``plain``: self-contained; ``sbatch`` it by hand. It carries the resolved job in a variable, writes it into the
  run directory and launches ``python -m hpc_train.train``.
* ``submitit``: the same script whose launch line is submitit's ``_submit`` command and whose log paths are
  submitit's (see ``hpc_train/slurm/submitit_hook.py``).

Python writes the header and the preamble of job values (:mod:`.header`, :mod:`.variables`); the template is
structure and hpc-train's own shell, and prints nothing else (:mod:`.jinja`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, Literal, Sequence

import jinja2

from ..config import JobSpec, dump_yaml
from ..errors import TemplateError
from ..runs import rundir
from . import variables
from .jinja import JobValuePrinted, ScriptText, load_template, sources, syntax_error, template_location
from .header import header

Form = Literal["plain", "submitit"]


@dataclass(frozen=True)
class LaunchSpec:
    """How the ranks are started and where the batch log goes."""

    form: Form = "plain"
    stdout: str = "slurm-%x-%j.out"
    """``#SBATCH --output``: relative to the submit directory, which always exists (a missing output
    directory makes Slurm fail the job without a word)."""
    stderr: str = "slurm-%x-%j.out"
    command: str = ""
    """``submitit`` form: submitit's ``python -u -m submitit.core._submit <folder>`` (shell words it quoted)."""
    task_stdout: str = ""
    task_stderr: str = ""
    array: str | None = None
    """``--array`` value (``0-2%2``) for sweeps."""
    run_dir: str | None = None
    """Continue this run directory (``submit --resume`` / ``--chain``) instead of a new one per job id."""
    points_dir: str | None = None
    """A submitted sweep: each point's resolved job is ``<points_dir>/point-<i>.yaml`` (written before sbatch), so
    the script stays small for any sweep; unset (``render``): the points are in the script itself."""
    point_offset: int = 0
    """The sweep point of this array's task 0 (a sweep split into several arrays at the cluster's MaxArraySize)."""
    sweep_id: str | None = None
    """The first array's job id, which names every point's run directory (``<sweep id>_<point>``); unset: this
    array is the first (``$SLURM_ARRAY_JOB_ID``)."""


def array_tasks(points: int, pack: int) -> int:
    """Array tasks of a sweep of ``points`` points, ``pack`` per task."""
    return -(-points // max(1, pack))


def watchdog_on(spec: JobSpec) -> bool:
    """The batch script runs the watchdog (``slurm.hang_timeout_s`` > 0), except in a container (the batch shell,
    outside it, may not have hpc-train) and for packed points (the pack runner watches them itself)."""
    s = spec.slurm
    return s.hang_timeout_s > 0 and s.container is None and s.pack == 1


_PREAMBLE = "\0hpc-train preamble\0"
"""Stands for the preamble while the body renders: the preamble holds the variables the rendered body reads."""


def render_sbatch(
    spec: JobSpec,
    *,
    runs_root: str,
    python: str,
    launch: LaunchSpec | None = None,
    site_dirs: Sequence[Path] = (),
    array_specs: Sequence[JobSpec] = (),
) -> str:
    """The complete sbatch script for ``spec``.

    ``runs_root`` is the absolute directory holding run groups (``runs_dir`` resolved against the
    submit directory); ``python`` is the interpreter the ranks run. ``array_specs``: one job per array
    task (a sweep); they may differ from ``spec`` only in ``train.*``.
    """
    launch = launch or LaunchSpec()
    if array_specs and not launch.array:
        raise TemplateError("array_specs given without an --array range")
    if spec.slurm.pack > 1 and not array_specs:
        # One job: nothing to pack, and no cores to ask for beyond its own (sbatch_cpus_per_task counts pack).
        spec = replace(spec, slurm=replace(spec.slurm, pack=1))
    name = spec.slurm.template
    template = load_template(name, site_dirs)
    point_yamls = [] if launch.points_dir else [dump_yaml(s) for s in array_specs]
    run_group = str(PurePosixPath(runs_root) / spec.name)
    binds: list[str] = []
    if spec.slurm.container is not None:
        binds = list(dict.fromkeys([*spec.slurm.container.binds, runs_root]))
    sweep_points = launch.point_offset + len(array_specs)
    values = variables.job_values(spec, runs_root=runs_root, run_group=run_group, python=python, launch=launch,
                                  job_yaml=dump_yaml(spec), point_yamls=point_yamls, sweep_points=sweep_points,
                                  container_binds=binds)
    context = dict(
        # Structure: what {% if %} and {% for %} read (printing any of it is refused).
        job=spec, launch=launch, watchdog=watchdog_on(spec), array_yamls=point_yamls, runs_root=runs_root,
        run_group=run_group, python=python, sweep_points=sweep_points, container_binds=binds,
        job_yaml=values["HT_JOB_YAML"], job_yaml_eof=values["HT_JOB_YAML"],
        # hpc-train's own words, which {{ }} prints.
        sbatch_header=ScriptText(header(spec, launch, name)),
        job_variables=ScriptText(_PREAMBLE),
        job_environment=ScriptText(variables.exports(spec.slurm.env)),
        entrypoint=ScriptText("hpc_train.command" if spec.command else "hpc_train.train"),
        run_files=SimpleNamespace(state_log=ScriptText(rundir.STATE_LOG)),
        exit_codes=SimpleNamespace(**{key: ScriptText(str(code)) for key, code in (
            ("checkpointed", rundir.EXIT_CHECKPOINTED), ("hung", rundir.EXIT_HUNG),
            ("hang_requeued", rundir.EXIT_HANG_REQUEUED))}),
    )
    body = _render(template, context)
    used = variables.used_names(body)
    _check_names(template, used - set(values))
    _check_launch(template, body)
    return body.replace(_PREAMBLE, variables.preamble(values, used), 1)


def _check_names(template: jinja2.Template, unknown: set[str]) -> None:
    """A variable the script reads that hpc-train does not assign would read as empty: refused, with its file."""
    if not unknown:
        return
    name = sorted(unknown)[0]
    where = next((file for file, source in sources(template) if name in source), template.filename)
    raise TemplateError(f"{where}: reads ${name}, which hpc-train does not assign; the HT_ variables are listed in "
                        "templates/default.sbatch.j2")


LAUNCHES_ITSELF = "{# hpc-train: launches-itself #}"
"""The marker a template carries when it starts its ranks without srun (mpirun, its own launcher)."""

_RUNS_SRUN = re.compile(r"^[ \t]*[^#\n][^\n]*?\bsrun\b|^[ \t]*srun\b", re.MULTILINE)
"""srun as a word on a line that is not a comment (after exec or env, in bash -c's code): a guard against a template
that forgot it, not a reading of shell."""


def _check_launch(template: jinja2.Template, text: str) -> None:
    """A script that never runs srun would run its launch line once, in the batch shell, instead of one task
    per rank: refused, unless the template (or a partial it includes) says it launches its ranks itself."""
    if _RUNS_SRUN.search(text) or any(LAUNCHES_ITSELF in source for _file, source in sources(template)):
        return
    raise TemplateError(f"{template.filename}: the script never runs srun, so the ranks would not start as tasks of "
                        "the job; launch them with srun (as partials/launch_srun.j2 does), or, where the template "
                        f"starts them its own way, say so with {LAUNCHES_ITSELF}")


def _render(template: jinja2.Template, context: dict[str, Any]) -> str:
    """The rendered text; every way a template can fail is a TemplateError naming its file and line."""
    try:
        return template.render(**context)
    except JobValuePrinted:
        raise
    except TemplateError:
        raise
    except jinja2.TemplateSyntaxError as exc:
        raise syntax_error(exc, template.environment, None) from None
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"{template_location(exc)}: included template {exc.name!r} not found") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{template_location(exc)}: {exc.message}") from None
    except Exception as exc:  # a filter or test raised inside the template
        raise TemplateError(f"{template_location(exc)}: {type(exc).__name__}: {exc}") from None
