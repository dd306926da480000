"""hpc_train/render/jinja.py on its own: the rule every ``{{ }}`` obeys (hpc-train's ScriptText passes; anything
else is refused with the template's file and line and the variable to read), the search path (a site file of the
same name wins), and the compile cache (used, recompiled when a site template is edited, bounded, and never a
reason for a render to fail)."""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import pytest

from hpc_train.errors import TemplateError
from hpc_train.render import jinja
from hpc_train.render.jinja import JobValuePrinted, ScriptText, cache_dir, environment, load_template
from hpc_train.resources import templates_dir


@pytest.fixture(autouse=True)
def fresh_environments():
    """Each test starts as a new process would: no Environment (nor its in-memory templates) from another test."""
    jinja._environment.cache_clear()
    yield
    jinja._environment.cache_clear()


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """A cache of the test's own under the session's (tests/conftest.py)."""
    home = tmp_path / "xdg-cache"
    home.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def site_template(directory: Path, text: str, name: str = "t.sbatch.j2") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


class Compiles:
    """Counts the templates Jinja compiles from source (a cache hit compiles nothing)."""

    def __init__(self, monkeypatch):
        self.names: list[str] = []
        original = jinja2.Environment.compile

        def compile(env, source, name=None, filename=None, raw=False, defer_init=False):
            self.names.append(name)
            return original(env, source, name, filename, raw, defer_init)

        monkeypatch.setattr(jinja2.Environment, "compile", compile)


# ------------------------------------------------------------------------------------------------
# The rule
# ------------------------------------------------------------------------------------------------

def test_script_text_is_printed(tmp_path):
    site_template(tmp_path, "a {{ words }} b\n")
    assert load_template("t.sbatch.j2", [tmp_path]).render(words=ScriptText("echo hi")) == "a echo hi b\n"


@pytest.mark.parametrize("value", ["plain", "", 3, None, ["x"]])
def test_anything_else_is_refused_with_file_line_and_expression(tmp_path, value):
    path = site_template(tmp_path, "#!/bin/bash\n# line 2\nexport X={{ anything }}\n")
    with pytest.raises(JobValuePrinted, match=rf"^{path}:3: \{{\{{ anything \}}\}} prints a job value into the "
                                              "script; it has no script variable"):
        load_template("t.sbatch.j2", [tmp_path]).render(anything=value)


@pytest.mark.parametrize("expression, advice", [
    ("job.name", 'read it from "$HT_NAME"'),
    ("job.slurm.partition | upper", 'read it from "$HT_PARTITION"'),
    ("job.slurm.modules", 'read it from "${HT_MODULES[@]}"'),
    ("job.slurm.env.NCCL_DEBUG", 'read it from "$NCCL_DEBUG"'),
    ("job.train.epochs", "it has no script variable (train.* reach the ranks in job.yaml)"),
])
def test_the_refusal_names_the_variable_to_read(tmp_path, expression, advice):
    from hpc_train.config import resolve_job
    from hpc_train.config.layers import NO_SITE

    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.env.NCCL_DEBUG=INFO"])
    site_template(tmp_path, f"#!/bin/bash\n{{{{ sbatch_header }}}}\necho {{{{ {expression} }}}}\n")
    with pytest.raises(JobValuePrinted) as refused:
        load_template("t.sbatch.j2", [tmp_path]).render(job=spec, sbatch_header=ScriptText("#SBATCH --nodes=1"))
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 't.sbatch.j2'}:3: {{{{ {expression} }}}}") and advice in message


def test_a_refusal_is_a_template_error_exit_2():
    assert issubclass(JobValuePrinted, TemplateError) and TemplateError("x").exit_code == 2


def test_a_missing_name_is_strict_undefined_not_an_empty_string(tmp_path):
    site_template(tmp_path, "echo {{ nothing_here }}\n")
    with pytest.raises(jinja2.UndefinedError, match="nothing_here"):
        load_template("t.sbatch.j2", [tmp_path]).render()


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    path = site_template(tmp_path, "#!/bin/bash\n{% if x %}\n")
    with pytest.raises(TemplateError, match=rf"^{path}:\d+: template syntax error"):
        load_template("t.sbatch.j2", [tmp_path])


# ------------------------------------------------------------------------------------------------
# The search path
# ------------------------------------------------------------------------------------------------

def test_a_site_template_of_the_same_name_wins(tmp_path):
    ours = templates_dir() / "default.sbatch.j2"
    site = site_template(tmp_path, "# the site's own\n", "default.sbatch.j2")
    assert load_template("default.sbatch.j2", [tmp_path]).filename == str(site)
    assert load_template("default.sbatch.j2", []).filename == str(ours)
    assert jinja.search_path([tmp_path]) == [tmp_path, templates_dir()]
    assert jinja.template_source("default.sbatch.j2", [tmp_path]) == (site, "# the site's own\n")


def test_only_listed_templates_have_a_source(tmp_path):
    with pytest.raises(TemplateError, match=r"no template '\.\./\.\./etc/passwd' on the search path"):
        jinja.template_source("../../etc/passwd", [tmp_path])


# ------------------------------------------------------------------------------------------------
# The compile cache
# ------------------------------------------------------------------------------------------------

def test_the_tests_never_write_the_users_cache():
    # tests/conftest.py points XDG_CACHE_HOME at a session directory before any test runs.
    home_cache = Path(os.path.expanduser("~")) / ".cache"
    assert Path(os.environ["XDG_CACHE_HOME"]) != home_cache
    assert home_cache not in cache_dir().parents


def test_compiled_templates_are_kept_and_used(cache_home, monkeypatch):
    compiles = Compiles(monkeypatch)
    load_template("default.sbatch.j2", [])
    assert compiles.names == ["default.sbatch.j2"]
    assert cache_dir() == cache_home / "hpc-train" / "jinja" and any(cache_dir().iterdir())
    jinja._environment.cache_clear()  # as the next process would start
    load_template("default.sbatch.j2", [])
    assert compiles.names == ["default.sbatch.j2"]  # no second compile: read from the cache


def test_code_compiled_without_the_rule_is_never_loaded(tmp_path, cache_home, monkeypatch):
    # Review of issue 25: the rule lives in the compiled code (finalize), and Jinja keys its cache by the template's
    # name, file and source alone; an entry another Environment (no finalize: an older hpc-train) wrote under that
    # key must not be read, or {{ job.name }} would print unchecked.
    site_template(tmp_path / "site", "{{ name }}\n")
    directory = cache_dir()
    unchecked = jinja2.Environment(loader=jinja2.FileSystemLoader([str(tmp_path / "site")]),
                                   bytecode_cache=jinja2.FileSystemBytecodeCache(str(directory)))
    assert unchecked.get_template("t.sbatch.j2").render(name="$(touch x)") == "$(touch x)"  # written to the cache
    with pytest.raises(JobValuePrinted):
        load_template("t.sbatch.j2", [tmp_path / "site"]).render(name="$(touch x)")


@pytest.mark.parametrize("new_process", [False, True])
def test_an_edited_site_template_is_compiled_again(tmp_path, cache_home, monkeypatch, new_process):
    path = site_template(tmp_path / "site", "# version 1\n", "default.sbatch.j2")
    assert load_template("default.sbatch.j2", [tmp_path / "site"]).render() == "# version 1\n"
    path.write_text("# version 2, longer\n")
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 2))  # an edit a second later, as a person makes
    if new_process:
        jinja._environment.cache_clear()
    assert load_template("default.sbatch.j2", [tmp_path / "site"]).render() == "# version 2, longer\n"


def test_the_cache_stays_bounded(tmp_path, cache_home, monkeypatch):
    monkeypatch.setattr(jinja, "MAX_CACHE_ENTRIES", 3)
    for index in range(6):  # six temporary site folders, as test runs or sweeps of site templates leave behind
        jinja._environment.cache_clear()
        site_template(tmp_path / f"site{index}", f"# {index}\n")
        load_template("t.sbatch.j2", [tmp_path / f"site{index}"])
    assert len(list(cache_dir().iterdir())) == 3


def test_prune_keeps_the_newest_entries_and_removes_stale_temporary_files(tmp_path):
    cache = jinja._QuietCache(str(tmp_path))
    for age, name in enumerate(["__jinja2_new.cache", "__jinja2_mid.cache", "__jinja2_old.cache",
                                "__jinja2_x.cache12345.tmp"]):
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (1_000_000 - age * 10, 1_000_000 - age * 10))
    (tmp_path / "not-ours").write_bytes(b"")
    cache.prune(keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["__jinja2_mid.cache", "__jinja2_new.cache", "not-ours"]


@pytest.mark.parametrize("blocked", ["cache root is missing", "cache root is a file", "our folder is a file"])
def test_a_cache_that_cannot_be_made_means_no_cache(tmp_path, monkeypatch, blocked):
    # A missing cache root is the user's to make (hpc-train makes its own folder in a cache, never the cache).
    if blocked == "cache root is a file":
        (tmp_path / "cache").write_text("")
    elif blocked == "our folder is a file":
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "hpc-train").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_dir() is None and (tmp_path / "cache").exists() == (blocked != "cache root is missing")
    assert environment([]).bytecode_cache is None
    assert load_template("default.sbatch.j2", []).filename == str(templates_dir() / "default.sbatch.j2")


def test_a_cache_that_fails_while_rendering_never_fails_the_render(cache_home, monkeypatch):
    # The folder was there when hpc-train looked, and is gone when it reads and writes (removed meanwhile, another
    # user's, a full disk): every read and write of an entry fails; the render goes on, compiling as it goes.
    from hpc_train.config import resolve_job
    from hpc_train.config.layers import NO_SITE
    from hpc_train.render import render_sbatch

    spec, _ = resolve_job(None, site=NO_SITE)
    vanished = cache_home / "vanished"
    monkeypatch.setattr(jinja, "cache_dir", lambda: vanished)
    compiles = Compiles(monkeypatch)
    assert environment([]).bytecode_cache.directory == str(vanished)
    assert "#SBATCH --nodes=1" in render_sbatch(spec, runs_root="/r", python="python3")
    assert "default.sbatch.j2" in compiles.names and not vanished.exists()


DAMAGE = {
    "garbage": lambda entry: b"\x00garbage",
    "code cut short": lambda entry: entry[:200],  # a killed write: Jinja's header whole
    "checksum cut short": lambda entry: entry[:len(jinja2.bccache.bc_magic) + 3],
    "checksum garbled": lambda entry: jinja2.bccache.bc_magic + b"\x80\x04garbage",
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_entry_is_a_miss(cache_home, monkeypatch, damage):
    load_template("default.sbatch.j2", [])
    for entry in cache_dir().iterdir():
        entry.write_bytes(DAMAGE[damage](entry.read_bytes()))
    jinja._environment.cache_clear()
    compiles = Compiles(monkeypatch)
    load_template("default.sbatch.j2", [])
    assert compiles.names == ["default.sbatch.j2"]
