"""The Jinja environment: the template search path, the compile cache, and the one rule every ``{{ }}`` obeys.

The rule (GitHub's hardening rule for Actions, applied to sbatch scripts): a job value never becomes script text.
Python writes the ``#SBATCH`` header and assigns every job value to a read-only variable (:mod:`.variables`); the
template reads ``"$HT_NAME"`` and uses Jinja for structure only (``{% if %}``, loops over hpc-train's own choices).
A ``{{ }}`` may print only hpc-train's own words (:class:`ScriptText`: the header, the preamble, exit codes, file
names, the entrypoint module); anything else is refused at render time, naming the template file and line and the
variable to read instead. Nothing here reads shell: the value is refused before it can land anywhere.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import jinja2

from .. import __version__
from ..errors import TemplateError
from ..resources import templates_dir


class ScriptText(str):
    """Text hpc-train makes itself, from no job text (or from job text it quoted itself): printable by ``{{ }}``."""


class JobValuePrinted(TemplateError):
    """A ``{{ }}`` printed something that is not :class:`ScriptText`."""


def search_path(site_dirs: Sequence[Path] = ()) -> list[Path]:
    """Site template directories first, then the package's own."""
    return [Path(d) for d in site_dirs] + [templates_dir()]


def cache_dir() -> Path | None:
    """Where compiled templates are kept (``$XDG_CACHE_HOME/hpc-train/jinja``, else ``~/.cache/...``): None when it
    cannot be written, or the cache root itself does not exist (hpc-train makes its own folder in a user's cache,
    never the cache), and templates are compiled on each call as before."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = Path(base) / "hpc-train" / "jinja"
    if not Path(base).is_dir():
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return directory if os.access(directory, os.W_OK | os.X_OK) else None


MAX_CACHE_ENTRIES = 200
"""Compiled templates kept at most: the shipped ones are 14, and every site template folder adds its own entries
(each entry is keyed by the template's file, so a temporary folder's never come back); after each write, the
oldest written beyond this many are removed, so the cache stays bounded (a removed entry is only compiled again)."""


class _QuietCache(jinja2.FileSystemBytecodeCache):
    """Jinja's file cache (keyed by the template's name and file, checked against its source's checksum: an edited
    site template is compiled again), where a failure to read or write is a cache miss, never an error, and which
    prunes itself to :data:`MAX_CACHE_ENTRIES` whenever it writes (a write is a cache miss: rare, never the hot
    path of a render that finds its templates compiled)."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # unreadable, or damaged where Jinja unpickles its checksum (pickle raises many kinds)
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
            self.prune()
        except OSError:
            pass

    def prune(self, keep: int | None = None) -> None:
        """Remove all but the ``keep`` (:data:`MAX_CACHE_ENTRIES`) most recently written entries, and any temporary
        file a killed write left behind."""
        keep = MAX_CACHE_ENTRIES if keep is None else keep
        written: list[tuple[float, str]] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.startswith("__jinja2_"):  # Jinja's own names, ours alone in this folder
                    try:
                        written.append((entry.stat().st_mtime, entry.path))
                    except OSError:
                        continue  # removed meanwhile by another process's prune
        written.sort(reverse=True)
        for _mtime, path in written[keep:]:
            try:
                os.remove(path)
            except OSError:
                pass


# The names of the filters site templates used before every job value became a variable: still registered, so an
# old template gets the message that says which variable to read, not "no filter named shquote".
LEGACY_FILTERS = ("shquote", "sbatch", "sbatch_flag", "comment")


# How templates are compiled. Jinja keys a cache entry by the template's name, file and source alone, yet the code it
# compiles depends on these (with ``finalize`` set, every {{ }} calls it: the rule lives in the compiled code); so the
# entry's file name also carries these options and both versions, and code compiled otherwise is never loaded.
_COMPILE_OPTIONS = dict(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
_COMPILE_KEY = hashlib.sha256(repr((sorted(_COMPILE_OPTIONS.items()), "finalize", "StrictUndefined",
                                    jinja2.__version__, __version__)).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=8)
def _environment(dirs: tuple[str, ...], cache: str | None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(dirs)),
        undefined=jinja2.StrictUndefined,  # a missing variable is an error, never an empty string
        finalize=_finalize,  # the module docstring's rule
        bytecode_cache=_QuietCache(cache, pattern=f"__jinja2_{_COMPILE_KEY}_%s.cache") if cache else None,
        **_COMPILE_OPTIONS,
    )
    env.filters.update({name: str for name in LEGACY_FILTERS})
    return env


def environment(site_dirs: Sequence[Path] = ()) -> jinja2.Environment:
    cache = cache_dir()
    return _environment(tuple(str(d) for d in search_path(site_dirs)), str(cache) if cache else None)


def _finalize(value: Any) -> Any:
    """Every ``{{ }}`` of every template: hpc-train's own words, or refused (module docstring)."""
    if isinstance(value, ScriptText):
        return value
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined: the missing name's own error, with its file and line
    where, expression = _template_expression()
    raise JobValuePrinted(f"{where}: {{{{ {expression} }}}} prints a job value into the script; {_advice(expression)}")


def _advice(expression: str) -> str:
    from .variables import variable_for

    name = variable_for(expression)
    if name is not None:
        return f'read it from "${name}"' if not name.startswith("@") else f'read it from "${{{name[1:]}[@]}}"'
    return ("it has no script variable (train.* reach the ranks in job.yaml); the script reads job values only from "
            "the HT_ variables hpc-train assigns (templates/default.sbatch.j2 lists them)")


def _template_expression() -> tuple[str, str]:
    """``file:line`` of the ``{{ }}`` being finalized (the innermost template frame) and its expression's text."""
    frame = sys._getframe(2)
    while frame is not None:
        template = frame.f_globals.get("__jinja_template__")
        if template is not None:
            line = template.get_corresponding_lineno(frame.f_lineno)
            return f"{template.filename}:{line}", _expression_on(template.filename, line)
        frame = frame.f_back
    return "<template>", "..."


_OWN_WORDS = re.compile(r"^(sbatch_header|job_variables|job_environment|exit_codes\.\w+|run_files\.\w+|entrypoint)$")


def _expression_on(filename: str | None, line: int) -> str:
    """The first ``{{ }}`` on that template line that is not one of hpc-train's own words."""
    try:
        text = Path(filename or "").read_text(encoding="utf-8").splitlines()[line - 1]
    except (OSError, IndexError):
        return "..."
    for expression in re.findall(r"\{\{-?\s*(.*?)\s*-?\}\}", text):
        if not _OWN_WORDS.match(expression):
            return expression
    return "..."


def list_templates(site_dirs: Sequence[Path] = ()) -> list[tuple[str, Path, list[Path]]]:
    """Every template and partial (``*.j2``) as (name, the file that wins on the search path, the files
    it overrides): a site directory's ``partials/bootstrap.j2`` replaces ours for every template."""
    found: dict[str, list[Path]] = {}
    for directory in search_path(site_dirs):
        if directory.is_dir():
            for path in sorted(directory.rglob("*.j2")):
                found.setdefault(path.relative_to(directory).as_posix(), []).append(path)
    return [(name, paths[0], paths[1:]) for name, paths in sorted(found.items())]


def template_source(name: str, site_dirs: Sequence[Path] = ()) -> tuple[Path, str]:
    """The source of a template or partial by its name on the search path (what ``templates list`` shows); no
    other file (``../../etc/passwd``) is a template."""
    for listed, path, _overridden in list_templates(site_dirs):
        if listed == name:
            return path, path.read_text(encoding="utf-8")
    where = ", ".join(str(d) for d in search_path(site_dirs))
    raise TemplateError(f"no template {name!r} on the search path ({where}); `hpc-train templates list` shows "
                        "the names")


def syntax_error(exc: jinja2.TemplateSyntaxError, env: jinja2.Environment, name: str | None) -> TemplateError:
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


def load_template(name: str, site_dirs: Sequence[Path]) -> jinja2.Template:
    env = environment(site_dirs)
    try:
        return env.get_template(name)
    except jinja2.TemplateSyntaxError as exc:
        raise syntax_error(exc, env, name) from None
    except jinja2.TemplateNotFound as exc:
        where = ", ".join(str(d) for d in search_path(site_dirs))
        raise TemplateError(f"template {exc.name!r} not found; search path: {where}") from None


def sources(template: jinja2.Template) -> list[tuple[str, str]]:
    """(file, source) of a template and of every template it includes, imports or extends (by a literal name)."""
    from jinja2 import meta

    env, seen, todo, found = template.environment, set(), [template.name], []
    while todo:
        name = todo.pop()
        if name is None or name in seen:
            continue
        seen.add(name)
        source, filename, _ = env.loader.get_source(env, name)  # type: ignore[union-attr]
        found.append((filename or name, source))
        todo.extend(meta.find_referenced_templates(env.parse(source)))
    return found


def template_location(exc: BaseException) -> str:
    """``file:line`` of the innermost template frame in a Jinja traceback."""
    import traceback

    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename and frame.filename.endswith(".j2"):
            return f"{frame.filename}:{frame.lineno}"
    return "<template>"
