"""Jinja environment, template search path, quoting filters, and the pure ``render_sbatch``.

``render_sbatch(spec, ...) -> str`` reads templates and returns text: no Slurm, no submitit, nothing
written. Two forms share one template (docs/design.md, decision 1):

* ``plain``: self-contained; ``sbatch`` it by hand. It carries the resolved job as a heredoc, writes it
  into the run directory and launches ``python -m hpc_train.train``.
* ``submitit``: the same script whose launch line is submitit's ``_submit`` command and whose log paths
  are submitit's (see ``hpc_train/slurm/submitit_hook.py``).

Shell-safe by default, site templates included: every ``{{ ... }}`` passes through :func:`_finalize`,
which lets through what the quoting filters made (``shquote``, ``sbatch``, ``sbatch_flag``, ``comment``,
``join`` of quoted words), what hpc-train wrote itself (the job YAML heredoc, submitit's launch command),
and plain words (letters, digits, ``@%+=:,./-``: inert in any shell context). Anything else — a job
value with a space, a quote, ``$(...)`` — is refused at render time, naming the template file and line:
quoting it automatically would be wrong inside double quotes or a heredoc, so the template must say how.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
import traceback
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, Literal, Sequence

import jinja2

from . import __version__
from .config import JobSpec, dump_yaml
from .errors import TemplateError
from .resources import templates_dir
from .runs import rundir

Form = Literal["plain", "submitit"]


class ShellSafe(str):
    """Text that may stand in a script as it is: quoted by a filter, or written by hpc-train itself."""


# shlex.quote's own notion of a word that needs no quotes: inert anywhere (unquoted, in "...", in a heredoc).
_PLAIN_WORD = re.compile(r"[\w@%+=:,./-]*\Z", re.ASCII)
_WORD_SEPARATOR = re.compile(r"[\w@%+=:,./ -]*\Z", re.ASCII)


class UnquotedValue(Exception):
    """A value that is not a plain word reached a template's output without a quoting filter."""


def shquote(value: Any) -> ShellSafe:
    """One shell word, whatever the value holds (spaces, quotes, ``$(...)``, newlines)."""
    return ShellSafe(shlex.quote(str(value)))


def sbatch_value(value: Any) -> ShellSafe:
    """A value on an ``#SBATCH`` line: quoted like a shell word; a newline cannot be carried at all
    (the rest would become a shell command), so it is refused."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise TemplateError(f"a value on an #SBATCH line contains a newline: {text!r}; remove it")
    return shquote(text)


def sbatch_flag(value: str) -> ShellSafe:
    """``--name=value`` for an option built by hpc-train itself (e.g. the GPU request)."""
    name, _, rest = value.partition("=")
    return ShellSafe(f"{name}={sbatch_value(rest)}" if rest else shquote(name))


def comment(value: Any) -> ShellSafe:
    """Text for a ``#`` comment line: on one line, and quoted when it is not a plain word (so it stays
    inert even where a template misuses it outside a comment)."""
    return ShellSafe(shlex.quote(" ".join(str(value).split())))


def join(items: Any, separator: str = "") -> str:
    """Jinja's ``join``, keeping words that were quoted (``modules | map('shquote') | join(' ')``) safe."""
    parts = list(items)
    text = separator.join(str(p) for p in parts)
    words_safe = all(isinstance(p, ShellSafe) or _PLAIN_WORD.match(str(p)) for p in parts)
    return ShellSafe(text) if words_safe and _WORD_SEPARATOR.match(separator) else text


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` of every template: quoted, written by us, or a plain word — else refused."""
    if isinstance(value, ShellSafe):
        return value
    text = "" if value is None else str(value)
    if _PLAIN_WORD.match(text):
        return text
    raise UnquotedValue(text)


@dataclass(frozen=True)
class LaunchSpec:
    """How the ranks are started and where the batch log goes."""

    form: Form = "plain"
    stdout: str = "slurm-%x-%j.out"
    """``#SBATCH --output``: relative to the submit directory, which always exists (a missing output
    directory makes Slurm fail the job without a word)."""
    stderr: str = "slurm-%x-%j.out"
    command: str = ""
    """``submitit`` form: submitit's ``python -u -m submitit.core._submit <folder>`` (already quoted)."""
    task_stdout: str = ""
    task_stderr: str = ""
    array: str | None = None
    """``--array`` value (``0-2%2``) for sweeps."""
    run_dir: str | None = None
    """Continue this run directory (``submit --resume`` / ``--chain``) instead of a new one per job id."""


def array_tasks(points: int, pack: int) -> int:
    """Array tasks of a sweep of ``points`` points, ``pack`` per task."""
    return -(-points // max(1, pack))


def search_path(site_dirs: Sequence[Path] = ()) -> list[Path]:
    """Site template directories first, then the package's own."""
    return [Path(d) for d in site_dirs] + [templates_dir()]


@functools.lru_cache(maxsize=8)
def _environment(dirs: tuple[str, ...]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(dirs)),
        undefined=jinja2.StrictUndefined,  # a missing variable is an error, never an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,  # shell-safe by default: see the module docstring
    )
    env.filters.update(shquote=shquote, sbatch=sbatch_value, sbatch_flag=sbatch_flag, comment=comment, join=join)
    return env


def environment(site_dirs: Sequence[Path] = ()) -> jinja2.Environment:
    return _environment(tuple(str(d) for d in search_path(site_dirs)))


def list_templates(site_dirs: Sequence[Path] = ()) -> list[tuple[str, Path, list[Path]]]:
    """Every template and partial (``*.j2``) as (name, the file that wins on the search path, the files
    it overrides): a site directory's ``partials/bootstrap.j2`` replaces ours for every template."""
    found: dict[str, list[Path]] = {}
    for directory in search_path(site_dirs):
        if directory.is_dir():
            for path in sorted(directory.rglob("*.j2")):
                found.setdefault(path.relative_to(directory).as_posix(), []).append(path)
    return [(name, paths[0], paths[1:]) for name, paths in sorted(found.items())]


def _template_location(exc: BaseException) -> str:
    """``file:line`` of the innermost template frame in a Jinja traceback."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename and frame.filename.endswith(".j2"):
            return f"{frame.filename}:{frame.lineno}"
    return "<template>"


def gpu_request(spec: JobSpec) -> str | None:
    s = spec.slurm
    if s.gpus_per_node <= 0:
        return None
    if s.gpu_flag == "gres":
        return f"--gres={s.gres_name}:{s.gpus_per_node}"
    return f"--gpus-per-node={s.gpus_per_node}"


def batchnorm_text(spec: JobSpec) -> ShellSafe:
    """The ranks' BatchNorm decision (``train.sync_bn``), for a comment line of the script's header: hpc-train's
    own words and numbers, no job text, so it stands as written."""
    from .config.batchnorm import decide

    t = spec.train
    decision = decide(t, spec.slurm.world_size)
    return ShellSafe(" ".join(decision.describe().split()))


def heredoc_delimiter(text: str) -> str:
    """A heredoc end marker that cannot occur as a line of ``text`` (derived from its hash)."""
    marker = "HPC_TRAIN_JOB_" + hashlib.sha256(text.encode()).hexdigest()[:12].upper()
    while marker in text.splitlines():  # would need a hash preimage; tested with a fixed digest
        marker += "_"
    return marker


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
    template = _load_template(name, site_dirs)
    # Written by hpc-train itself, and only ever placed in a quoted heredoc or as the launch command.
    job_yaml = ShellSafe(dump_yaml(spec))
    array_yamls = [ShellSafe(dump_yaml(s)) for s in array_specs]
    launch = replace(launch, command=ShellSafe(launch.command))
    run_group = str(PurePosixPath(runs_root) / spec.name)
    binds: list[str] = []
    if spec.slurm.container is not None:
        binds = list(dict.fromkeys([*spec.slurm.container.binds, runs_root]))
    context = dict(
        job=spec,
        runs_root=runs_root,
        run_group=run_group,
        python=python,
        launch=launch,
        job_yaml=job_yaml,
        job_yaml_eof=heredoc_delimiter("".join([job_yaml, *array_yamls])),
        array_yamls=array_yamls,
        template_name=name,
        version=__version__,
        gpu_request=gpu_request(spec),
        container_binds=binds,
        batchnorm=batchnorm_text(spec),
        entrypoint="hpc_train.command" if spec.command else "hpc_train.train",
        run_files=SimpleNamespace(state_log=rundir.STATE_LOG),
        exit_codes=SimpleNamespace(checkpointed=rundir.EXIT_CHECKPOINTED),
    )
    return _render(template, context)


def _load_template(name: str, site_dirs: Sequence[Path]) -> jinja2.Template:
    try:
        return environment(site_dirs).get_template(name)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename}:{exc.lineno}: template syntax error: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        where = ", ".join(str(d) for d in search_path(site_dirs))
        raise TemplateError(f"template {exc.name!r} not found; search path: {where}") from None


def _render(template: jinja2.Template, context: dict[str, Any]) -> str:
    """The rendered text; every way a template can fail is a TemplateError naming its file and line."""
    try:
        return template.render(**context)
    except TemplateError:
        raise
    except UnquotedValue as exc:
        raise TemplateError(f"{_template_location(exc)}: {str(exc)[:60]!r} would reach the shell unquoted; write "
                            "{{ ... | shquote }} (| sbatch on an #SBATCH line)") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename}:{exc.lineno}: template syntax error: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"{_template_location(exc)}: included template {exc.name!r} not found") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{_template_location(exc)}: {exc.message}") from None
    except Exception as exc:  # a filter or test raised inside the template
        raise TemplateError(f"{_template_location(exc)}: {type(exc).__name__}: {exc}") from None


def template_source(name: str, site_dirs: Sequence[Path] = ()) -> tuple[Path, str]:
    for directory in search_path(site_dirs):
        path = directory / name
        if path.is_file():
            return path, path.read_text(encoding="utf-8")
    where = ", ".join(str(d) for d in search_path(site_dirs))
    raise TemplateError(f"template {name!r} not found; search path: {where}")
