"""render_sbatch: golden files, shell validity, hostile values, site templates, template errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train import config, render
from hpc_train.config import SiteConfig, resolve_job
from hpc_train.errors import TemplateError
from hpc_train.render import LaunchSpec, render_sbatch
from hpc_train.slurm.submitit_hook import submitit_launch
from tests.golden_files import check_golden

GOLDEN = Path(__file__).parent / "golden"
SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
NO_SITE = SiteConfig(path=None, defaults={}, template_dirs=())

# A fixed job for golden files: every #SBATCH key and bootstrap feature on, nothing host-specific.
GOLDEN_SETS = [
    "slurm.partition=a100", "slurm.account=proj-ml", "slurm.qos=normal", "slurm.constraint=ib",
    "slurm.exclusive=true", "slurm.mem_gb=0", "slurm.time=12:00:00", "slurm.modules=[cuda/12.4, nccl/2.21]",
    "slurm.venv=/shared/envs/lt", "slurm.env.NCCL_SOCKET_IFNAME=^docker,lo", "slurm.env.NCCL_IB_HCA=mlx5_0:1",
    "slurm.extra_sbatch={mail-type: END, hint: nomultithread}", "slurm.cpus_per_task=8",
]
VARIANTS = {
    # name: (launcher, form, extra sets)
    "srun-plain": ("srun", "plain", []),
    "srun-submitit": ("srun", "submitit", []),
    "torchrun-plain": ("torchrun", "plain", []),
    "torchrun-submitit": ("torchrun", "submitit", []),
    "srun-plain-apptainer": ("srun", "plain", ["slurm.container={image: /images/lt.sif, binds: [/data]}",
                                               "slurm.venv=null"]),
    "srun-plain-pyxis": ("srun", "plain", ["slurm.container={runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.05-py3'}",
                                           "slurm.venv=null", "slurm.gpu_flag=gres"]),
    # The user's own command on every rank (submit -- CMD), with the exit block's requeue on exit 75.
    "srun-plain-command": ("srun", "plain", []),
    "torchrun-submitit-command": ("torchrun", "submitit", []),
    # --pack 2 of a 3-point sweep on one GPU: two array tasks, the pack runner in each.
    "srun-submitit-packed": ("srun", "submitit", ["slurm.pack=2"]),
}
COMMAND = ("python", "train.py", "--lr", "0.1", "$(touch /tmp/pwned)", "it's")


def golden_spec(launcher, extra=(), **flags):
    spec, _ = resolve_job(None, site=NO_SITE, sets=[*GOLDEN_SETS, *extra],
                          flags={"slurm.nodes": 4, "slurm.gpus_per_node": 8, "slurm.launcher": launcher,
                                 "name": "cifar100-lt", **flags})
    return spec


def render_variant(variant):
    launcher, form, extra = VARIANTS[variant]
    flags = {"command": COMMAND} if variant.endswith("-command") else {}
    sweep = []
    if variant.endswith("-packed"):
        flags = {"slurm.nodes": 1, "slurm.gpus_per_node": 1}
        sweep = [golden_spec(launcher, [*extra, f"train.seed={seed}"], **flags) for seed in range(3)]
    spec = sweep[0] if sweep else golden_spec(launcher, extra, **flags)
    launch = LaunchSpec()
    if form == "submitit":
        folder = Path("/shared/project/runs/cifar100-lt/.submitit")
        launch = submitit_launch(folder, f"python -u -m submitit.core._submit {folder}",
                                 map_count=render.array_tasks(len(sweep), 2) if sweep else None)
    return render_sbatch(spec, runs_root="/shared/project/runs", python="/shared/envs/lt/bin/python", launch=launch,
                         array_specs=sweep)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_golden(variant):
    check_golden(GOLDEN / f"default.sbatch.j2--{variant}.sh", render_variant(variant),
                 how_to_update=".venv/bin/python -m pytest tests/test_render.py -k golden")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_scripts_pass_bash_n_and_shellcheck(variant, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render_variant(variant))
    subprocess.run(["bash", "-n", str(script)], check=True)
    result = subprocess.run([SHELLCHECK, "--severity=style", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_header_lines():
    text = render_variant("srun-plain")
    for line in ["#SBATCH --job-name=cifar100-lt", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --gpus-per-node=8", "#SBATCH --mem=0G",
                 "#SBATCH --time=12:00:00", "#SBATCH --partition=a100", "#SBATCH --account=proj-ml",
                 "#SBATCH --qos=normal", "#SBATCH --constraint=ib", "#SBATCH --exclusive",
                 "#SBATCH --signal=USR2@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --mail-type=END", "#SBATCH --hint=nomultithread",
                 "srun --kill-on-bad-exit=1 --wait=60 \\", "module purge", "module load cuda/12.4 nccl/2.21",
                 "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1"]:
        assert line in text.splitlines(), line  # whole lines: --nodes=4 must not pass as part of --nodes=40
    torch_text = render_variant("torchrun-plain")
    assert "#SBATCH --ntasks-per-node=1" in torch_text and "#SBATCH --cpus-per-task=64" in torch_text
    assert "#SBATCH --signal=B:USR2@120" in torch_text and "--nproc-per-node=8" in torch_text
    assert "#SBATCH --gres=gpu:8" in render_variant("srun-plain-pyxis")


def test_a_pack_without_a_sweep_is_one_job_with_its_own_cores():
    # --pack K asks for K points' cores per array task; a single job has one point and must not ask for more
    # than its srun line uses.
    spec, _ = resolve_job(None, site=NO_SITE, flags={"slurm.pack": 4, "slurm.gpus_per_node": 0,
                                                      "slurm.tasks_per_node": 1, "slurm.cpus_per_task": 3})
    lines = render_sbatch(spec, runs_root="/r", python="python3").splitlines()
    assert "#SBATCH --cpus-per-task=3" in lines and "packed" not in "\n".join(lines)
    packed = render_sbatch(spec, runs_root="/r", python="python3", launch=LaunchSpec(array="0-1"),
                           array_specs=[spec, spec])
    assert "#SBATCH --cpus-per-task=12" in packed.splitlines() and "# --pack 4:" in packed


def test_no_gpu_line_for_cpu_jobs():
    spec, _ = resolve_job(None, site=NO_SITE)
    text = render_sbatch(spec, runs_root="/r", python="python3")
    assert "--gpus" not in text and "--gres" not in text


# ------------------------------------------------------------------------------------------------
# Hostile values: render, run the script with stub srun/scontrol/module, check nothing was injected
# and the stubs received the exact original values.
# ------------------------------------------------------------------------------------------------

# Relative "touch PWNED": the script runs in tmp_path, and a job name cannot hold a '/'.
HOSTILE = "a b'c\"d; touch PWNED; $(touch PWNED) `touch PWNED` $HOME \\ %"


STUB = """#!/bin/bash
# Records its argv (NUL-separated) and, for srun, the environment it was given.
name=$(basename "$0")
printf '%s\\0' "$@" > "$STUB_LOG/$name.argv"
if [ "$name" = srun ]; then env -0 > "$STUB_LOG/srun.env"; fi
if [ "$name" = scontrol ] && [ "$1" = show ] && [ "$2" = hostnames ]; then echo node01; fi
exit 0
"""


def test_hostile_values_are_data_not_code(tmp_path):
    mark = tmp_path / "PWNED"
    hostile = HOSTILE
    # '%' is refused in names and run paths (Slurm expands it in log paths); everywhere else it is data.
    runs_root = tmp_path / f"runs {hostile.replace('%', '')}"
    multi_line = hostile + "\nsecond line; touch PWNED"
    spec, _ = resolve_job(None, site=NO_SITE, flags={"name": f"job {hostile.replace('%', '')}"}, sets=[
        "slurm.python=" + sys.executable,
    ])
    spec = config.replace(spec, slurm=config.replace(
        spec.slurm, modules=(hostile, multi_line), env={"HOSTILE": hostile, "MULTI": multi_line},
        srun_args=(f"--comment={hostile}",)))
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec, runs_root=str(runs_root), python=sys.executable))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0

    stub_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    stub_dir.mkdir(), log_dir.mkdir()
    for tool in ("srun", "scontrol", "module"):
        (stub_dir / tool).write_text(STUB)
        (stub_dir / tool).chmod(0o755)
    env = {"PATH": f"{stub_dir}:/usr/bin:/bin", "STUB_LOG": str(log_dir), "HOME": str(tmp_path),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node01", "SLURM_CPUS_PER_TASK": "1"}
    result = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not mark.exists(), "a hostile value was executed as a command"

    def argv(tool):
        return (log_dir / f"{tool}.argv").read_bytes().decode().split("\0")[:-1]

    assert argv("module") == ["load", hostile, multi_line]
    srun_args = argv("srun")
    assert f"--comment={hostile}" in srun_args
    run_dir = runs_root / spec.name / "4242"
    assert f"--output={run_dir}/logs/rank-%t.log" in srun_args
    assert srun_args[-6:] == [sys.executable, "-u", "-m", "hpc_train.train", "--resolved", str(run_dir / "job.yaml")]
    srun_env = dict(item.split("=", 1) for item in (log_dir / "srun.env").read_bytes().decode().split("\0") if "=" in item)
    assert srun_env["HOSTILE"] == hostile and srun_env["MULTI"] == multi_line
    assert srun_env["HPC_TRAIN_RUN_DIR"] == str(run_dir)
    assert (srun_env["MASTER_ADDR"], srun_env["MASTER_PORT"]) == ("node01", str(20000 + 4242))
    # The job file the ranks read is the job exactly as resolved.
    assert config.spec_from_yaml_text((run_dir / "job.yaml").read_text(), "job.yaml") == spec


# A site template as an admin might write it, with no quoting filter anywhere: one job value per line.
NAIVE_TEMPLATE = """#!/bin/bash
#SBATCH --job-name={{ job.name }}
#SBATCH --partition={{ job.slurm.partition }}
#SBATCH --account={{ job.slurm.account }}
#SBATCH --comment={{ job.slurm.extra_sbatch.comment }}
export P={{ job.slurm.partition }}
echo "running {{ job.name }} from {{ run_group }}"
module load {{ job.slurm.modules | join(" ") }}
. {{ job.slurm.venv }}/bin/activate
export FOO={{ job.slurm.env.FOO }}
cat <<END
{{ job.train.data.root }}
END
srun {{ job.slurm.srun_args | join(" ") }} {{ python }} -m hpc_train.train
"""
NAIVE_BENIGN = ["slurm.partition=gpu", "slurm.account=proj", "slurm.extra_sbatch={comment: ok}",
                "slurm.modules=[cuda/12.4, nccl/2.21]", "slurm.venv=/shared/venv", "slurm.env.FOO=bar",
                "train.data.root=/data", "slurm.srun_args=[--mpi=none]"]
# (field set to the hostile string, the template line where it first appears)
NAIVE_FIELDS = [("name", 2), ("slurm.partition", 3), ("slurm.account", 4), ("slurm.extra_sbatch.comment", 5),
                ("slurm.modules", 8), ("slurm.venv", 9), ("slurm.env.FOO", 10), ("train.data.root", 12),
                ("slurm.srun_args", 14), ("runs_root", 7)]


def _naive(tmp_path, hostile_field=None, value=HOSTILE.replace("%", "")):
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / "naive.sbatch.j2").write_text(NAIVE_TEMPLATE)
    sets = [*NAIVE_BENIGN, "slurm.template=naive.sbatch.j2"]
    runs_root = "/shared/runs"
    flags = {}
    if hostile_field == "runs_root":
        runs_root = f"/shared/{value}"
    elif hostile_field == "name":
        flags["name"] = value
    elif hostile_field in ("slurm.modules", "slurm.srun_args"):
        sets.append(f"{hostile_field}={json.dumps(['ok', value])}")
    elif hostile_field:
        sets.append(f"{hostile_field}={json.dumps(value)}")
    spec, _ = resolve_job(None, site=NO_SITE, sets=sets, flags=flags)
    return render_sbatch(spec, runs_root=runs_root, python="/usr/bin/python3", site_dirs=[site_dir])


def test_site_template_without_filters_renders_plain_words(tmp_path):
    text = _naive(tmp_path)
    assert "export P=gpu" in text and "module load cuda/12.4 nccl/2.21" in text and "export FOO=bar" in text


@pytest.mark.parametrize("field,line", NAIVE_FIELDS, ids=[f for f, _ in NAIVE_FIELDS])
def test_site_template_without_filters_refuses_a_hostile_value(tmp_path, field, line):
    # Quoting it in place would be wrong inside "..." or a heredoc: the render stops, naming file and line.
    with pytest.raises(TemplateError, match=rf"naive\.sbatch\.j2:{line}: the job value .* a shell would not take it as plain data"):
        _naive(tmp_path, field)


@pytest.mark.parametrize("value", ["a b", "x;y", "$(id)", "`id`", "a'b", 'a"b', "a\\b", "*", "~root", "a&b", "é€"])
def test_anything_but_a_plain_word_is_refused_unquoted(tmp_path, value):
    with pytest.raises(TemplateError, match="lands unquoted, where the shell splits, globs and expands it"):
        _naive(tmp_path, "slurm.env.FOO", value)


def test_quoting_filters_are_not_applied_twice(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "quoted.sbatch.j2").write_text(
        "#!/bin/bash\n#SBATCH --partition={{ job.slurm.partition | sbatch }}\n"
        "export P={{ job.slurm.partition | shquote }}\nmodule load {{ job.slurm.modules | map('shquote') | join(' ') }}\n"
        "# {{ job.name | comment }}\n{# hpc-train: launches-itself #}")
    spec, _ = resolve_job(None, site=NO_SITE, flags={"name": "my   run"},
                          sets=["slurm.template=quoted.sbatch.j2", "slurm.partition=a b", "slurm.modules=[m1, m 2]"])
    text = render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[site_dir])
    assert text.splitlines()[1:] == ["#SBATCH --partition='a b'", "export P='a b'", "module load m1 'm 2'",
                                     "# 'my run'"]


@pytest.mark.parametrize("field", ["partition", "account", "constraint"])
def test_newline_cannot_reach_an_sbatch_line(field):
    spec, _ = resolve_job(None, site=NO_SITE)
    spec = config.replace(spec, slurm=config.replace(spec.slurm, **{field: "gpu\n#SBATCH --x"}))
    with pytest.raises(TemplateError, match="contains a newline"):
        render_sbatch(spec, runs_root="/r", python="python3")


def test_hostile_sbatch_values_are_quoted():
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.account=a'b; c", "slurm.extra_sbatch={comment: x $(y)}"])
    text = render_sbatch(spec, runs_root="/r", python="python3")
    assert "#SBATCH --account='a'\"'\"'b; c'" in text and "#SBATCH --comment='x $(y)'" in text


# ------------------------------------------------------------------------------------------------
# Site templates and template errors
# ------------------------------------------------------------------------------------------------

def test_site_template_dir_wins_and_reuses_partials(tmp_path):
    site_dir = tmp_path / "site-templates"
    site_dir.mkdir()
    (site_dir / "default.sbatch.j2").write_text(
        "#!/bin/bash\n# SITE TEMPLATE for {{ job.name | comment }}\n{% include 'partials/sbatch_header.j2' %}\n"
        "srun true\n")
    spec, _ = resolve_job(None, site=NO_SITE)
    text = render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[site_dir])
    assert "# SITE TEMPLATE for digits-lt-demo" in text and "#SBATCH --nodes=1" in text
    (site_dir / "partials").mkdir()
    (site_dir / "partials" / "bootstrap.j2").write_text("# site bootstrap\n")
    listed = {name: (path, overridden) for name, path, overridden in render.list_templates([site_dir])}
    assert listed["default.sbatch.j2"][0] == site_dir / "default.sbatch.j2"
    # An overridden partial is listed with the file it replaces; the others come from the package.
    assert listed["partials/bootstrap.j2"] == (site_dir / "partials" / "bootstrap.j2",
                                               [render.templates_dir() / "partials" / "bootstrap.j2"])
    assert listed["partials/rendezvous.j2"] == (render.templates_dir() / "partials" / "rendezvous.j2", [])


def test_template_syntax_error_names_file_and_line(tmp_path):
    (tmp_path / "broken.sbatch.j2").write_text("#!/bin/bash\n\n{% if job.name %}\necho hi\n")
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=broken.sbatch.j2"])
    with pytest.raises(TemplateError, match=r"broken\.sbatch\.j2:\d+: template syntax error"):
        render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path])


@pytest.mark.parametrize("where", ["template", "partial"])
def test_a_jinja_lexer_error_names_the_file_and_says_raw(tmp_path, where):
    # Review of issue 19, S9: shell's ${#arr[@]} opens a Jinja comment; the lexer's error named "None:2".
    shell = 'arr=(1); echo "${#arr[@]}"\n'
    (tmp_path / "p.j2").write_text(shell)
    (tmp_path / "c.sbatch.j2").write_text("#!/bin/bash\n" + ('{% include "p.j2" %}\n' if where == "partial" else shell))
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=c.sbatch.j2"])
    file = "p.j2:1" if where == "partial" else "c.sbatch.j2:2"
    with pytest.raises(TemplateError, match=rf"^{tmp_path}/{file}: template syntax error: Missing end of comment tag; .*"
                                            r"\{% raw %\}"):
        render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path])


def test_join_takes_jinjas_attribute_argument(tmp_path):
    # Review of issue 19, N3: the override of join dropped Jinja's attribute= (a TypeError at render time).
    (tmp_path / "j.sbatch.j2").write_text("#!/bin/bash\n# {{ [job.slurm, job.slurm] | join(',', attribute='partition') }}"
                                          "\n{{ job.slurm.modules | map('shquote') | join(' ') }}\nsrun true\n")
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=j.sbatch.j2", "slurm.partition=gpu",
                                                    "slurm.modules=[a b]"])
    assert render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path]).splitlines()[1:3] == [
        "# gpu,gpu", "'a b'"]


def test_undefined_variable_names_file_and_line(tmp_path):
    (tmp_path / "undef.sbatch.j2").write_text("#!/bin/bash\n# ok\necho {{ job.slurm.no_such_field }}\n")
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=undef.sbatch.j2"])
    with pytest.raises(TemplateError, match=r"undef\.sbatch\.j2:3: .*no_such_field"):
        render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path])


def test_template_not_found_shows_search_path(tmp_path):
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=missing.sbatch.j2"])
    with pytest.raises(TemplateError, match=f"'missing.sbatch.j2' not found; search path: {tmp_path}, "):
        render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path])


def test_heredoc_delimiter_never_in_text(monkeypatch):
    text = "name: x\n"
    marker = render.heredoc_delimiter(text)
    assert marker.startswith("HPC_TRAIN_JOB_") and marker not in text.splitlines()

    class FixedDigest:  # a hash "collision": the job text holds the very line the digest would give
        def __init__(self, _data):
            pass

        def hexdigest(self):
            return "ab" * 32

    monkeypatch.setattr(render.hashlib, "sha256", FixedDigest)
    colliding = "name: x\nHPC_TRAIN_JOB_ABABABABABAB\nHPC_TRAIN_JOB_ABABABABABAB_\n"
    marker = render.heredoc_delimiter(colliding)
    assert marker == "HPC_TRAIN_JOB_ABABABABABAB__" and marker not in colliding.splitlines()
