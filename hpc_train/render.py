"""Jinja environment, template search path, quoting filters, and the pure ``render_sbatch``.

``render_sbatch(spec, ...) -> str`` reads templates and returns text: no Slurm, no submitit, nothing
written. Two forms share one template (docs/design.md, decision 1):

* ``plain``: self-contained; ``sbatch`` it by hand. It carries the resolved job as a heredoc, writes it
  into the run directory and launches ``python -m hpc_train.train``.
* ``submitit``: the same script whose launch line is submitit's ``_submit`` command and whose log paths
  are submitit's (see ``hpc_train/slurm/submitit_hook.py``).

Shell-safe by default, site templates included: every ``{{ ... }}`` passes through :func:`_finalize`, which
marks the value (and whether a quoting filter made it: ``shquote``, ``sbatch``, ``sbatch_flag``, ``comment``,
``join`` of quoted words). The rendered script is then read as bash reads it (:mod:`hpc_train.shellsafe`), and a
value that lands where a shell would expand, parse or run it — unquoted with a space or ``$(...)``, a quoted
word inside double quotes or an unquoted heredoc, in arithmetic, as code for ``eval`` or ``bash -c``, as a
shell builtin in command position — is refused at render time, naming the template file and line. Quoting it
automatically would be wrong in half of these places, so the template must say how.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import re
import shlex
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, Literal, Sequence

import jinja2

from . import __version__, shellsafe
from .config import JobSpec, dump_yaml
from .errors import TemplateError
from .resources import templates_dir
from .runs import rundir

Form = Literal["plain", "submitit"]


class ShellSafe(str):
    """Text a quoting filter made: its quotes are its own (the render still checks where it lands)."""


class HpcTrainWord(str):
    """A word hpc-train makes itself from no job text (the heredoc's end marker): not a job value."""


# shlex.quote's own notion of a word that needs no quotes: inert anywhere (unquoted, in "...", in a heredoc).
_PLAIN_WORD = re.compile(r"[\w@%+=:,./-]*\Z", re.ASCII)
_WORD_SEPARATOR = re.compile(r"[\w@%+=:,./ -]*\Z", re.ASCII)


def shquote(value: Any) -> ShellSafe:
    """One shell word, whatever the value holds (spaces, quotes, ``$(...)``, newlines)."""
    return ShellSafe(shlex.quote(str(value)))


def sbatch_value(value: Any) -> ShellSafe:
    """A value on an ``#SBATCH`` line: quoted like a shell word, which sbatch's own option reader unquotes too,
    with each backslash doubled (sbatch reads one as an escape, inside quotes as well); a newline cannot be
    carried at all (the rest would become a shell command), so it is refused."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise TemplateError(f"a value on an #SBATCH line contains a newline: {text!r}; remove it")
    return shquote(text.replace("\\", "\\\\"))


def sbatch_flag(value: str) -> ShellSafe:
    """``--name=value`` for an option built by hpc-train itself (e.g. the GPU request)."""
    name, _, rest = value.partition("=")
    return ShellSafe(f"{name}={sbatch_value(rest)}" if rest else shquote(name))


def comment(value: Any) -> ShellSafe:
    """Text for a ``#`` comment line: on one line, and quoted when it is not a plain word (so it stays
    inert even where a template misuses it outside a comment)."""
    return ShellSafe(shlex.quote(" ".join(str(value).split())))


@jinja2.pass_environment
def join(env: jinja2.Environment, items: Any, separator: str = "", attribute: str | int | None = None) -> str:
    """Jinja's ``join`` (``attribute=`` included), keeping words that were quoted
    (``modules | map('shquote') | join(' ')``) safe."""
    parts = list(items) if attribute is None else [jinja2.filters.make_attrgetter(env, attribute)(i) for i in items]
    text = separator.join(str(p) for p in parts)
    words_safe = all(isinstance(p, ShellSafe) or _PLAIN_WORD.match(str(p)) for p in parts)
    return ShellSafe(text) if words_safe and _WORD_SEPARATOR.match(separator) else text


class _Values:
    """The values one render marks, and the template line each comes from (for the message that refuses one)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def mark(self, text: str, kind: str) -> str:
        self.lines.append(_template_line())
        return shellsafe.mark(text, kind, len(self.lines) - 1)


_VALUES: contextvars.ContextVar[_Values | None] = contextvars.ContextVar("hpc_train_render_values", default=None)


def _template_line() -> str:
    """``file:line`` of the template expression being finalized (the innermost template frame)."""
    frame = sys._getframe(2)
    while frame is not None:
        template = frame.f_globals.get("__jinja_template__")
        if template is not None:
            return f"{template.filename}:{template.get_corresponding_lineno(frame.f_lineno)}"
        frame = frame.f_back
    return "<template>"


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` of every template: marked, so the render can tell where it lands (module docstring)."""
    text = "" if value is None else str(value)
    values = _VALUES.get()
    if values is None or isinstance(value, HpcTrainWord):
        return text
    if shellsafe.is_marked(text) and not isinstance(value, ShellSafe):
        return text  # a macro's or a block's output: the values in it are marked already
    return values.mark(text, shellsafe.QUOTED if isinstance(value, ShellSafe) else shellsafe.RAW)


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


def watchdog_on(spec: JobSpec) -> bool:
    """The batch script runs the watchdog (``slurm.hang_timeout_s`` > 0), except in a container (the batch shell,
    outside it, may not have hpc-train) and for packed points (the pack runner watches them itself)."""
    s = spec.slurm
    return s.hang_timeout_s > 0 and s.container is None and s.pack == 1


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
    # The job's own text (a job value like any other: at home in a quoted heredoc); submitit's launch command,
    # quoted by hpc-train (slurm/submit.py).
    job_yaml = dump_yaml(spec)
    array_yamls = [] if launch.points_dir else [dump_yaml(s) for s in array_specs]
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
        job_yaml_eof=HpcTrainWord(heredoc_delimiter("".join([job_yaml, *array_yamls]))),
        array_yamls=array_yamls,
        sweep_points=launch.point_offset + len(array_specs),
        template_name=name,
        version=__version__,
        gpu_request=gpu_request(spec),
        container_binds=binds,
        batchnorm=batchnorm_text(spec),
        entrypoint="hpc_train.command" if spec.command else "hpc_train.train",
        run_files=SimpleNamespace(state_log=rundir.STATE_LOG),
        exit_codes=SimpleNamespace(checkpointed=rundir.EXIT_CHECKPOINTED, hung=rundir.EXIT_HUNG,
                                   hang_requeued=rundir.EXIT_HANG_REQUEUED),
        watchdog=watchdog_on(spec),
    )
    return _render(template, context)


def _syntax_error(exc: jinja2.TemplateSyntaxError, env: jinja2.Environment, name: str | None) -> TemplateError:
    """The error's template file and line (Jinja's lexer gives no file name: it is looked up), and what to do
    when shell text reads as Jinja (``${#arr[@]}`` opens a comment)."""
    where = exc.filename
    if where is None and env.loader is not None and (exc.name or name):
        try:
            where = env.loader.get_source(env, exc.name or name)[1]
        except jinja2.TemplateNotFound:
            where = exc.name or name
    hint = ""
    if "comment" in (exc.message or ""):
        hint = "; shell text with {# in it (${#arr[@]}) opens a Jinja comment: wrap it in {% raw %}...{% endraw %}"
    return TemplateError(f"{where or name}:{exc.lineno}: template syntax error: {exc.message}{hint}")


def _load_template(name: str, site_dirs: Sequence[Path]) -> jinja2.Template:
    env = environment(site_dirs)
    try:
        return env.get_template(name)
    except jinja2.TemplateSyntaxError as exc:
        raise _syntax_error(exc, env, name) from None
    except jinja2.TemplateNotFound as exc:
        where = ", ".join(str(d) for d in search_path(site_dirs))
        raise TemplateError(f"template {exc.name!r} not found; search path: {where}") from None


SHELL_SAFE_HINT = ("write {{ ... | shquote }} as a word of its own, outside double quotes and unquoted heredocs "
                   "(| sbatch on an #SBATCH line, a quoted heredoc <<'EOF' for text)")


def _render(template: jinja2.Template, context: dict[str, Any]) -> str:
    """The rendered text, every job value in it checked where it lands; every way a template can fail is a
    TemplateError naming its file and line."""
    values = _Values()
    token = _VALUES.set(values)
    try:
        marked = _render_marked(template, context)
    finally:
        _VALUES.reset(token)
    try:
        text, regions = shellsafe.unmark(marked)
    except shellsafe.Malformed as exc:
        raise TemplateError(f"{template.filename}: a filter changed a marked value ({exc}); the script cannot be "
                            "checked for shell safety: apply quoting filters to job values only") from None
    reading = shellsafe.read(text, regions)
    finding = reading.finding
    if finding is None:
        _check_launch(template, reading.programs)
        return text
    if finding.origin is None:
        raise TemplateError(f"{template.filename}: {finding.where}; job values cannot be checked, so it is not "
                            "rendered")
    raise TemplateError(f"{values.lines[finding.origin.index]}: the job value {finding.value[:60]!r} lands "
                        f"{finding.where}, so a shell would not take it as plain data; {SHELL_SAFE_HINT}")


LAUNCHES_ITSELF = "{# hpc-train: launches-itself #}"
"""The marker a template carries when it starts its ranks without srun (mpirun, its own launcher)."""


def _sources(template: jinja2.Template) -> list[str]:
    """The source of a template and of every template it includes, imports or extends (by a literal name)."""
    from jinja2 import meta

    env, seen, todo, found = template.environment, set(), [template.name], []
    while todo:
        name = todo.pop()
        if name is None or name in seen:
            continue
        seen.add(name)
        source = env.loader.get_source(env, name)[0]  # type: ignore[union-attr]
        found.append(source)
        todo.extend(meta.find_referenced_templates(env.parse(source)))
    return found


def _check_launch(template: jinja2.Template, programs: frozenset[str]) -> None:
    """A script that never runs srun would run its launch line once, in the batch shell, instead of one task
    per rank: refused, unless the template (or a partial it includes) says it launches its ranks itself."""
    if "srun" in programs or any(LAUNCHES_ITSELF in source for source in _sources(template)):
        return
    raise TemplateError(f"{template.filename}: the script never runs srun, so the ranks would not start as tasks of "
                        "the job; launch them with srun (as partials/launch_srun.j2 does), or, where the template "
                        f"starts them its own way, say so with {LAUNCHES_ITSELF}")


def _render_marked(template: jinja2.Template, context: dict[str, Any]) -> str:
    try:
        return template.render(**context)
    except TemplateError:
        raise
    except jinja2.TemplateSyntaxError as exc:
        raise _syntax_error(exc, template.environment, None) from None
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"{_template_location(exc)}: included template {exc.name!r} not found") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{_template_location(exc)}: {exc.message}") from None
    except Exception as exc:  # a filter or test raised inside the template
        raise TemplateError(f"{_template_location(exc)}: {type(exc).__name__}: {exc}") from None


def template_source(name: str, site_dirs: Sequence[Path] = ()) -> tuple[Path, str]:
    """The source of a template or partial by its name on the search path (what ``templates list`` shows); no
    other file (``../../etc/passwd``) is a template."""
    for listed, path, _overridden in list_templates(site_dirs):
        if listed == name:
            return path, path.read_text(encoding="utf-8")
    where = ", ".join(str(d) for d in search_path(site_dirs))
    raise TemplateError(f"no template {name!r} on the search path ({where}); `hpc-train templates list` shows "
                        "the names")
