"""Job values never execute, wherever a site template would put them (issue 19, item 1; issue 25, item 5): a
template prints no job value at all. Every ``{{ }}`` that prints one is refused at render time, naming the template
file and line and the variable to read instead, whatever shell context it sits in; the same place written with
``"$HT_..."`` renders, and bash, given the hostile value, runs none of it.

Each hostile case is shown to be real: rendered with the rule switched off (and the old quoting filters back), the
script run by bash creates the marker file.
"""

import os
import subprocess
import sys

import pytest

from hpc_train.config import SiteConfig, resolve_job
from hpc_train.errors import TemplateError
from hpc_train.render import render_sbatch
from tests.cli_helpers import assert_refused, cli, tree

NO_SITE = SiteConfig(path=None, defaults={}, template_dirs=())
P = "gpu$(touch P)"
INDEXED = "a[$(touch P)]"  # an array index: bash evaluates it as arithmetic, and runs the $( ) in it

# (id, template lines after #!/bin/bash, --set values, the line refused, whether bash runs it unchecked)
HOSTILE = [
    ("double-quotes-shquote", ['echo "p: {{ job.slurm.partition | shquote }}"'], [f"slurm.partition={P}"], 2, True),
    ("double-quotes-comment", ['echo "p: {{ job.slurm.partition | comment }}"'], [f"slurm.partition={P}"], 2, True),
    ("unquoted-heredoc", ["cat <<EOF", "{{ job.slurm.partition | shquote }}", "EOF"], [f"slurm.partition={P}"], 3,
     True),
    ("heredoc-command-substitution", ["cat <<EOF", "$({{ job.slurm.partition }} P)", "EOF"],
     ["slurm.partition=touch"], 3, True),
    ("parameter-default", ['echo "${UNSET:-{{ job.slurm.partition | shquote }}}"'], [f"slurm.partition={P}"], 2, True),
    ("single-quotes-closed", ["echo '{{ job.slurm.partition | shquote }}'"], ["slurm.partition=a; touch P; b"], 2,
     True),
    ("backquotes", ["echo `{{ job.slurm.partition }} P`"], ["slurm.partition=touch"], 2, True),
    ("command-position", ["{{ job.slurm.partition }} P"], ["slurm.partition=touch"], 2, True),
    ("builtin-in-command-position", ["{{ job.slurm.partition | shquote }} 'touch P'"], ["slurm.partition=eval"], 2,
     True),
    ("eval", ["eval {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2, True),
    ("bash-c", ["bash -c {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2, True),
    ("here-string-to-bash", ["bash <<< {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2, True),
    ("quoted-heredoc-to-bash", ["bash <<'EOF'", "{{ job.slurm.partition }} P", "EOF"], ["slurm.partition=touch"], 3,
     True),
    ("source-stdin", ["source /dev/stdin <<< {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2,
     True),
    ("trap", ["trap {{ job.slurm.partition | shquote }} EXIT"], ["slurm.partition=touch P"], 2, True),
    ("arithmetic", ["export A={{ job.slurm.env.A | shquote }}", "echo $(( {{ job.slurm.partition }} ))"],
     [f"slurm.env.A={INDEXED}", "slurm.partition=A"], 3, True),
    ("double-brackets", ["[[ {{ job.slurm.partition | shquote }} -eq 1 ]] || true"], [f"slurm.partition={INDEXED}"], 2,
     True),
    ("declare", ["declare {{ job.slurm.partition | shquote }}=1"], [f"slurm.partition={INDEXED}"], 2, True),
    ("printf-v", ["printf -v {{ job.slurm.partition | shquote }} x"], [f"slurm.partition={INDEXED}"], 2, True),
    ("read", ["read {{ job.slurm.partition | shquote }} <<< 1"], [f"slurm.partition={INDEXED}"], 2, True),
    ("indirect-expansion", ["export A={{ job.slurm.env.A | shquote }}", 'echo "${!{{ job.slurm.partition }}}"'],
     [f"slurm.env.A={INDEXED}", "slurm.partition=A"], 3, True),
    # Review of issue 19, M1: bash's options scanned as bash scans them, so the -c code is found
    *[(f"bash-options-{name}", [f"bash {options} {{{{ job.slurm.partition | shquote }}}}"], ["slurm.partition=touch P"],
       2, True) for name, options in [("euo-pipefail", "-euo pipefail -c"), ("o-pipefail", "-o pipefail -c"),
                                      ("O-extglob", "-O extglob -c"), ("rcfile", "--rcfile /dev/null -c"),
                                      ("c-dashdash", "-c --"), ("c-then-e", "-c -e"), ("c-plus-o", "+o posix -c"),
                                      ("s-stdin", "-s arg <<<")]],
    # M2: a shell reading its code from a pipe, a file descriptor or a process substitution
    ("pipe-to-bash", ["echo {{ job.slurm.partition | shquote }} | bash"], ["slurm.partition=touch P"], 2, True),
    ("pipe-to-bash-s", ["echo {{ job.slurm.partition | shquote }} | tr x y |& bash -s a"], ["slurm.partition=touch P"],
     2, True),
    ("heredoc-piped-to-bash", ["cat <<EOF | bash", "{{ job.slurm.partition }} P", "EOF"], ["slurm.partition=touch"],
     3, True),
    ("quoted-heredoc-piped-to-bash", ["cat <<'EOF' | bash", "{{ job.slurm.partition }} P", "EOF"],
     ["slurm.partition=touch"], 3, True),
    ("group-piped-to-sh", ["{", "  echo {{ job.slurm.partition | shquote }}", "} | sh"], ["slurm.partition=touch P"],
     3, True),
    ("bash-dev-fd-0", ["bash /dev/fd/0 <<EOF", "{{ job.slurm.partition }} P", "EOF"], ["slurm.partition=touch"], 3,
     True),
    ("dot-dev-fd-0", [". /dev/fd/0 <<< {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2, True),
    ("bash-proc-self-fd-0", ["bash /proc/self/fd/0 <<< {{ job.slurm.partition | shquote }}"],
     ["slurm.partition=touch P"], 2, True),
    ("bash-process-substitution", ["bash <(echo {{ job.slurm.partition | shquote }})"], ["slurm.partition=touch P"], 2,
     True),
    ("source-process-substitution", ["source <(echo {{ job.slurm.partition | shquote }})"], ["slurm.partition=touch P"],
     2, True),
    ("job-value-as-shell-option", ["bash {{ job.slurm.partition | shquote }} 'touch P'"], ["slurm.partition=-c"], 2,
     True),
    # M3: declare evaluates a ( ) value as an array's assignment (-a, -A, or a variable already an array)
    ("declare-a", ["declare -a arr={{ job.slurm.partition | shquote }}"], ["slurm.partition=([$(touch P)]=1)"], 2,
     True),
    ("declare-A", ["declare -A map={{ job.slurm.partition | shquote }}"], ["slurm.partition=([$(touch P)]=1)"], 2,
     True),
    ("local-a", ["f() { local -a arr={{ job.slurm.partition | shquote }}; }; f"], ["slurm.partition=([$(touch P)]=1)"],
     2, True),
    ("function-local-a", ["function f { local -a arr={{ job.slurm.partition | shquote }}; }; f"],
     ["slurm.partition=([$(touch P)]=1)"], 2, True),
    ("declare-on-an-array", ["arr=(); declare arr={{ job.slurm.partition | shquote }}"],
     ["slurm.partition=([0]=$(touch P))"], 2, True),
    # M4: ${X:offset:length} is arithmetic, its names evaluated as code
    ("substring-offset", ["export A={{ job.slurm.env.A | shquote }}", 'X=abc; echo "${X:{{ job.slurm.partition }}}"'],
     [f"slurm.env.A={INDEXED}", "slurm.partition=A"], 3, True),
    ("substring-length", ["export A={{ job.slurm.env.A | shquote }}", 'X=abc; echo ${X:0:{{ job.slurm.partition }}}'],
     [f"slurm.env.A={INDEXED}", "slurm.partition=A"], 3, True),
    ("positional-slice",
     ["export A={{ job.slurm.env.A | shquote }}", 'set -- a b; echo "${@:{{ job.slurm.partition }}}"'],
     [f"slurm.env.A={INDEXED}", "slurm.partition=A"], 3, True),
    # S5: an array assignment's elements are words, an unquoted [index]= before one arithmetic
    ("array-assignment-index", ["export A={{ job.slurm.env.A | shquote }}", "arr=([{{ job.slurm.partition }}]=1)"],
     [f"slurm.env.A={INDEXED}", "slurm.partition=A"], 3, True),
    ("array-element-unquoted", ["arr=(a {{ job.slurm.partition }})"], ["slurm.partition=$(touch P)"], 2, True),
    # S3: a value assigned to a variable bash runs (BASH_ENV, PS4 ...) or to one declared an integer
    ("assigned-bash-env", ["BASH_ENV={{ job.slurm.partition | shquote }} bash -c true"], ["slurm.partition=$(touch P)"],
     2, True),
    ("env-bash-env", ["env BASH_ENV={{ job.slurm.partition | shquote }} bash -c true"], ["slurm.partition=$(touch P)"],
     2, True),
    ("export-ps4", ["export PS4={{ job.slurm.partition | shquote }}", "set -x", "true"], ["slurm.partition=$(touch P)"],
     2, True),
    ("declared-integer", ["declare -i N", "N={{ job.slurm.partition | shquote }}"], [f"slurm.partition={INDEXED}"], 3,
     True),
    # S4: programs that run an argument through sh
    ("su-c", ["su -c {{ job.slurm.partition | shquote }} root"], ["slurm.partition=touch P"], 2, True),
    ("runuser-command", ["/usr/sbin/runuser --command={{ job.slurm.partition | shquote }} root"], ["slurm.partition=touch P"],
     2, True),
    ("flock-c", ["flock ./lock -c {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2, True),
    ("script-c", ["script -q -c {{ job.slurm.partition | shquote }} /dev/null"], ["slurm.partition=touch P"], 2, True),
    ("env-S", ["env -S {{ job.slurm.partition | shquote }}"], ["slurm.partition=touch ${HOME}/P"], 2, True),
    ("sbatch-wrap", ["sbatch --wrap={{ job.slurm.partition | shquote }}"], ["slurm.partition=touch P"], 2, False),
    ("ssh", ["ssh -p 22 node1 echo {{ job.slurm.partition | shquote }}"], ["slurm.partition=$(touch P)"], 2, False),
    ("watch", ["watch -n 1 echo {{ job.slurm.partition | shquote }}"], ["slurm.partition=$(touch P)"], 2, False),
    # S6: a value keeps its filter's quoting in code only where the template's own quotes kept it as written
    ("bash-c-value-outside-the-template-quotes", ['bash -c "echo "{{ job.slurm.partition | shquote }}'],
     ["slurm.partition=a; touch P"], 2, True),
    ("eval-value-quotes-removed", ["eval echo {{ job.slurm.partition | shquote }}"], ["slurm.partition=a; touch P"], 2,
     True),
    # What a $( ) holding a job value prints is that value: code where the shell runs what it is given
    ("eval-command-substitution", ['eval "$(echo {{ job.slurm.partition | shquote }})"'], ["slurm.partition=touch P"],
     2, True),
    ("bash-c-command-substitution", ['bash -c "$(printf %s {{ job.slurm.partition | shquote }})"'],
     ["slurm.partition=touch P"], 2, True),
    ("here-string-of-a-substitution", ['bash <<< "$(echo {{ job.slurm.partition | shquote }})"'],
     ["slurm.partition=touch P"], 2, True),
    ("arithmetic-test-of-a-substitution", ['[[ "$(echo {{ job.slurm.partition | shquote }})" -eq 1 ]] || true'],
     [f"slurm.partition={INDEXED}"], 2, True),
    # Refused without running anything, each for its own reason:
    ("assignment-name", ["{{ job.slurm.partition }}=1"], ["slurm.partition=PATH"], 2, False),
    ("brace-expansion", ["echo {a,{{ job.slurm.partition }}}"], ["slurm.partition=b,c"], 2, False),
    ("heredoc-end", ["cat <<'EOF'", "{{ job.slurm.partition | shquote }}", "EOF"], ["slurm.partition=EOF"], 3, False),
    ("sbatch-line-blank", ["#SBATCH --comment={{ job.slurm.partition }}"], ["slurm.partition=a --wrap=b"], 2, False),
    ("sbatch-escaped-quote", ["#SBATCH --comment={{ job.slurm.partition | shquote }}"], ["slurm.partition=a\\"], 2,
     False),
]
# The same contexts written by the rule: the value read from its variable. (id, template lines, --set values)
SAFE = [
    ("double-quotes", ['echo "p: $HT_PARTITION"'], [f"slurm.partition={P}"]),
    ("unquoted-heredoc", ["cat <<EOF", "$HT_PARTITION", "EOF"], [f"slurm.partition={P}"]),
    ("parameter-default", ['echo "${UNSET:-$HT_PARTITION}"'], [f"slurm.partition={P}"]),
    ("case-subject", ['case "$HT_PARTITION" in', "  gpu) echo y;;", "esac"], [f"slurm.partition={P}"]),
    ("double-brackets", ['[[ "$HT_PARTITION" == gpu ]] || true'], [f"slurm.partition={INDEXED}"]),
    ("argument-of-bash-c", ["bash -c 'echo \"$1\"' _ \"$HT_PARTITION\""], [f"slurm.partition={P}"]),
    ("argument-of-eval-d-code", ['eval \'echo "$HT_PARTITION"\''], ["slurm.partition=a; touch P"]),
    ("trap", ["trap 'echo \"$HT_PARTITION\"' EXIT"], ["slurm.partition=touch P"]),
    ("here-string", ['tr a b <<< "$HT_PARTITION"'], ["slurm.partition=$(touch P)"]),
    ("arithmetic-on-an-int", ["echo $(( HT_NODES * 2 ))", 'echo "${HT_NAME:HT_NODES}"'], ["slurm.nodes=2"]),
    ("array-elements", ['arr=("${HT_MODULES[@]}" "$HT_PARTITION")', 'echo "${arr[@]}"'],
     [f"slurm.partition={P}", "slurm.modules=[time, eval, '$(touch P)']"]),
    ("declare-a", ['declare -a arr=("$HT_PARTITION")', 'echo "${arr[0]}"'], ["slurm.partition=([$(touch P)]=1)"]),
    ("export", ['export X="$HT_PARTITION"', 'bash -c \'echo "$X"\''], [f"slurm.partition={P}; `touch P` \"'"]),
    ("sbatch-line", ["{{ sbatch_header }}"], ["slurm.extra_sbatch.comment='a b''c\"d \\ #e\\' $(touch P)"]),
    ("command-argument", ['command -v "$HT_PARTITION" >/dev/null || echo missing'], ["slurm.partition=touch P"]),
]


def _render(tmp_path, lines, sets, preamble=False):
    site = tmp_path / "tpl"
    site.mkdir(exist_ok=True)
    head = "#!/bin/bash\n" + ("{{ job_variables }}\n" if preamble else "")
    (site / "custom.j2").write_text(head + "\n".join(lines) + "\nsrun true\n")
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=custom.j2", *sets])
    return render_sbatch(spec, runs_root=str(tmp_path / "runs"), python=sys.executable, site_dirs=[site])


def _run(tmp_path, script):
    """The script as Slurm's batch shell runs it (srun a stand-in), in ``tmp_path``: whether it made P."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)
    subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, input="", capture_output=True, timeout=30,
                   env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "1", "HOME": str(tmp_path)})
    return (tmp_path / "P").exists()


def _first_printing_line(lines):
    """The template line (after #!/bin/bash) of the first {{ }}: where the refusal points."""
    return 2 + next(i for i, line in enumerate(lines) if "{{" in line)


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_job_value_printed_in_any_shell_context_is_refused_with_file_and_line(tmp_path, case):
    _, lines, sets, _, _ = case
    line = _first_printing_line(lines)
    with pytest.raises(TemplateError, match=rf"custom\.j2:{line}: \{{\{{ .* \}}\}} prints a job value into the script; "
                                            r"read it from \"\$"):
        _render(tmp_path, lines, sets)


def _unchecked(monkeypatch):
    """The environment as it was before the rule: anything printed, and the old quoting filters doing their quoting."""
    import shlex

    from hpc_train.render import jinja

    build = jinja._environment.__wrapped__

    def unchecked(dirs, _cache):
        env = build(dirs, None)
        env.finalize = lambda value: "" if value is None else str(value)
        env.filters.update(shquote=lambda v: shlex.quote(str(v)), comment=lambda v: shlex.quote(str(v)),
                           sbatch=lambda v: shlex.quote(str(v)))
        return env

    monkeypatch.setattr(jinja, "_environment", unchecked)


@pytest.mark.parametrize("case", [c for c in HOSTILE if c[4]], ids=[c[0] for c in HOSTILE if c[4]])
def test_without_the_rule_bash_runs_the_value(tmp_path, monkeypatch, case):
    # What the case guards against is real: printed as the old templates printed it, the script runs the job value.
    _, lines, sets, _, _ = case
    _unchecked(monkeypatch)
    assert _run(tmp_path, _render(tmp_path, lines, sets))


@pytest.mark.parametrize("case", SAFE, ids=[c[0] for c in SAFE])
def test_the_same_place_read_from_its_variable_renders_and_runs_nothing(tmp_path, case):
    _, lines, sets = case
    script = _render(tmp_path, lines, sets, preamble=True)
    assert "{{" not in script and not _run(tmp_path, script)


def test_a_variable_in_arithmetic_holds_an_int_only():
    # $(( HT_NODES )) evaluates the variable's value as code: it is written from an int field only, and the job
    # refuses text there before any script is rendered.
    from hpc_train.config import ConfigError

    with pytest.raises(ConfigError, match="slurm.nodes"):
        resolve_job(None, site=NO_SITE, sets=[f"slurm.nodes={INDEXED}"])
    from hpc_train.render import variables

    with pytest.raises(TypeError):
        variables.assignment("HT_NODES", 2.5)
    assert variables.assignment("HT_NODES", 4) == "readonly HT_NODES=4"
    assert variables.assignment("HT_NAME", "4") == "readonly HT_NAME=4"
    assert variables.assignment("HT_NAME", "a[$(touch P)]") == "readonly HT_NAME='a[$(touch P)]'"


def test_the_issue_example_is_refused_by_render_exit_2(tmp_path):
    # hpc-train render job.yaml > s && SLURM_JOB_ID=1 bash s created P: now exit 2, naming custom.j2:2.
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "custom.j2").write_text('#!/bin/bash\necho "p: {{ job.slurm.partition | shquote }}"\nsrun true\n')
    (tmp_path / "site.yaml").write_text("template_dirs: [tpl]\n")
    (tmp_path / "job.yaml").write_text("slurm: {template: custom.j2, partition: 'gpu$(touch P)'}\n")
    before = tree(tmp_path)
    result = cli("render", "job.yaml", cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HPC_TRAIN_SITE": "site.yaml",
                                                          "HOME": str(tmp_path),
                                                          "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert_refused(result, 'custom.j2:2: {{ job.slurm.partition | shquote }} prints a job value into the script; '
                           'read it from "$HT_PARTITION"')
    assert result.stdout == "" and tree(tmp_path) == before


@pytest.mark.parametrize("name", ["BASH_ENV", "ENV", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "IFS"])
def test_an_environment_variable_bash_expands_is_refused(tmp_path, name):
    # slurm.env is exported by the batch shell (its value safely quoted), but bash expands BASH_ENV's value and
    # sources the result in every non-interactive bash it starts: the torchrun launch line's `bash -c`.
    from hpc_train.errors import ConfigError

    subprocess.run(["bash", "-c", "true"], cwd=tmp_path, env={"BASH_ENV": "$(touch P)", "PATH": "/usr/bin:/bin"})
    assert (tmp_path / "P").exists()
    with pytest.raises(ConfigError, match=f"slurm.env: {name} is read by every bash the job starts"):
        resolve_job(None, site=NO_SITE, sets=[f"slurm.env.{name}=$(touch P)"])


EXPORTS = [("extra-sbatch", ["slurm.extra_sbatch.export=ALL,BASH_ENV=$(touch P)"], "slurm.extra_sbatch.export"),
           ("srun-args", ['slurm.srun_args=["--export=ALL,BASH_ENV=$(touch P)"]'], "slurm.srun_args"),
           ("srun-args-two-words", ['slurm.srun_args=[--export, "NONE,ENV=$(touch P)"]'], "slurm.srun_args"),
           ("srun-export-env", ["slurm.env.SRUN_EXPORT_ENV=ALL,PS4=$(touch P)"], "slurm.env.SRUN_EXPORT_ENV"),
           ("slurm-export-env", ["slurm.env.SLURM_EXPORT_ENV=ALL, BASH_ENV=x"], "slurm.env.SLURM_EXPORT_ENV"),
           ("sbatch-export", ["slurm.env.SBATCH_EXPORT=BASH_ENV"], "slurm.env.SBATCH_EXPORT")]


@pytest.mark.parametrize("case", EXPORTS, ids=[c[0] for c in EXPORTS])
def test_an_export_list_never_sets_a_variable_bash_expands(case):
    # Review of issue 19, M5: sbatch and srun export these into every shell of the job, as slurm.env would
    # (the previous test shows bash running BASH_ENV's $( )).
    from hpc_train.errors import ConfigError

    _, sets, where = case
    with pytest.raises(ConfigError, match=rf"{where}: exports (BASH_ENV|ENV|PS4), which every bash the job starts"):
        resolve_job(None, site=NO_SITE, sets=sets)


def test_an_export_list_of_other_variables_is_kept(tmp_path):
    sets = ["slurm.extra_sbatch.export=ALL,MY_ENV=1", 'slurm.srun_args=["--export=ALL,NCCL_DEBUG=INFO"]',
            "slurm.env.SRUN_EXPORT_ENV=ALL,BASHY=1"]
    spec, _ = resolve_job(None, site=NO_SITE, sets=sets)
    assert spec.slurm.extra_sbatch["export"] == "ALL,MY_ENV=1"
    assert "#SBATCH --export=ALL,MY_ENV=1" in render_sbatch(spec, runs_root=str(tmp_path), python=sys.executable)


def test_a_heredoc_delimiter_with_an_expansion_is_not_read_past(tmp_path):
    # Review of issue 19, N1: `cat <<$X` never matched its end line, so the rest of the script was taken for the
    # heredoc's body and a value after it was not checked. The rule reads no shell: the value is refused as printed.
    lines = ["cat <<$X", "x", "$X", "{{ job.slurm.partition }} P"]
    with pytest.raises(TemplateError, match=r"custom\.j2:5: \{\{ job\.slurm\.partition \}\} prints a job value"):
        _render(tmp_path, lines, ["slurm.partition=touch"])
