"""render_sbatch: golden files, shell validity, hostile values, site templates, template errors."""

import json
import re
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

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
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


def test_golden():
    # One whole script (the default srun plain one); each other variant is the lines that make it that variant.
    check_golden(GOLDEN / "default.sbatch.j2--srun-plain.sh", render_variant("srun-plain"),
                 how_to_update=".venv/bin/python -m pytest tests/unit/render/test_render.py -k golden")


SUBMITIT = "/shared/project/runs/cifar100-lt/.submitit"
TORCHRUN_AGENT = """    bash -c 'trap "" "$1"; shift; exec "$@"' torchrun-agent "$HT_SIGNAL" """
COMMAND_REQUEUE = 'if [ "$status" -eq 75 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt "$HT_MAX_REQUEUES" ]; then'
VARIANT_LINES = {
    "srun-plain": ['    "$PYTHON" -u -m hpc_train.train --resolved "$RUN_DIR/job.yaml"',
                   "#SBATCH --ntasks-per-node=8", "#SBATCH --signal=USR2@120"],
    "srun-submitit": ["export SUBMITIT_EXECUTOR=slurm", f"#SBATCH --output={SUBMITIT}/%j_0_log.out",
                      '    --unbuffered --output="$HT_TASK_STDOUT" --error="$HT_TASK_STDERR" \\',
                      f"readonly HT_TASK_STDOUT={SUBMITIT}/%j_%t_log.out",
                      f"readonly -a HT_LAUNCH_COMMAND=(python -u -m submitit.core._submit {SUBMITIT})",
                      '    "${HT_LAUNCH_COMMAND[@]}"'],
    "torchrun-plain": ["#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=64", "#SBATCH --signal=B:USR2@120",
                       'trap forward_signal "$HT_SIGNAL"', TORCHRUN_AGENT + "\\",
                       '    "$PYTHON" -u -m torch.distributed.run \\', "readonly HT_RANKS_PER_NODE=8",
                       '        --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node="$HT_RANKS_PER_NODE" \\'],
    "torchrun-submitit": ["export SUBMITIT_EXECUTOR=slurm", "#SBATCH --signal=B:USR2@120",
                          TORCHRUN_AGENT + '"${HT_LAUNCH_COMMAND[@]}" &'],
    "srun-plain-apptainer": ["readonly -a HT_CONTAINER_EXEC=(apptainer exec --nv --bind /data --bind "
                             "/shared/project/runs /images/lt.sif)", '    "${HT_CONTAINER_EXEC[@]}" \\'],
    "srun-plain-pyxis": ["#SBATCH --gres=gpu:8", '    --container-workdir="$PWD" \\', '    "${HT_SRUN_OPTIONS[@]}" \\',
                         "readonly -a HT_SRUN_OPTIONS=('--container-image=nvcr.io#nvidia/pytorch:24.05-py3' "
                         "--container-mounts=/shared/project/runs)"],
    "srun-plain-command": ['    "$PYTHON" -u -m hpc_train.command --resolved "$RUN_DIR/job.yaml"', COMMAND_REQUEUE,
                           "# Every rank runs the job's command (job.yaml's `command`, never through a shell): "
                           "'python train.py --lr 0.1 $(touch /tmp/pwned) it'\"'\"'s'"],
    "torchrun-submitit-command": [TORCHRUN_AGENT + '"${HT_LAUNCH_COMMAND[@]}" &', COMMAND_REQUEUE],
    "srun-submitit-packed": ["#SBATCH --array=0-1%2", "#SBATCH --cpus-per-task=16", "readonly HT_PACK=2",
                             "readonly HT_SWEEP_POINTS=3", '    printf \'%s\' "${HT_POINT_YAMLS[point]}" | run_file_write "$RUN_DIR/job.yaml"',
                             '    "$PYTHON" -u -m hpc_train.local --pack "${run_dirs[@]}"'],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_variant_has_the_lines_that_make_it(variant):
    lines = render_variant(variant).splitlines()
    for line in VARIANT_LINES[variant]:
        assert line in lines, line  # whole lines
    # A variant's own launch block shows only there (the golden script pins the rest).
    assert ("export SUBMITIT_EXECUTOR=slurm" in lines) == ("submitit" in variant and "packed" not in variant)
    assert any("torch.distributed.run" in line for line in lines) == (variant == "torchrun-plain")
    assert (COMMAND_REQUEUE in lines) == variant.endswith("-command")


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
                 "srun --kill-on-bad-exit=1 --wait=60 \\", "module purge", 'module load "${HT_MODULES[@]}"',
                 "readonly -a HT_MODULES=(cuda/12.4 nccl/2.21)",
                 "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1"]:
        assert line in text.splitlines(), line  # whole lines: --nodes=4 must not pass as part of --nodes=40
    torch_text = render_variant("torchrun-plain")
    assert "#SBATCH --ntasks-per-node=1" in torch_text and "#SBATCH --cpus-per-task=64" in torch_text
    assert "#SBATCH --signal=B:USR2@120" in torch_text and "readonly HT_RANKS_PER_NODE=8" in torch_text.splitlines()
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
    assert "#SBATCH --cpus-per-task=12" in packed.splitlines() and "readonly HT_PACK=4" in packed.splitlines()


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


# A site template as an admin wrote it before issue 25: job values printed into the script, one per line.
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
# The same template with the rule: hpc-train's header and preamble, the values read from their variables.
VARIABLES_TEMPLATE = """#!/bin/bash
{{ sbatch_header }}
{{ job_variables }}
export P="$HT_PARTITION"
echo "running $HT_NAME from $HT_RUN_GROUP"
module load "${HT_MODULES[@]}"
. "$HT_VENV_ACTIVATE"
echo "$FOO"
srun "${HT_SRUN_ARGS[@]}" "$HT_PYTHON" -m hpc_train.train
"""
NAIVE_BENIGN = ["slurm.partition=gpu", "slurm.account=proj", "slurm.extra_sbatch={comment: ok}",
                "slurm.modules=[cuda/12.4, nccl/2.21]", "slurm.venv=/shared/venv", "slurm.env.FOO=bar",
                "train.data.root=/data", "slurm.srun_args=[--mpi=none]"]
# (the template line, what the refusal says to read instead)
NAIVE_LINES = [(2, '"$HT_NAME"'), (3, '"$HT_PARTITION"'), (4, '"$HT_ACCOUNT"'), (5, "it has no script variable"),
               (6, '"$HT_PARTITION"'), (7, '"$HT_NAME"'), (8, '"${HT_MODULES[@]}"'), (9, '"$HT_VENV_ACTIVATE"'),
               (10, '"$FOO"'), (12, "it has no script variable"), (14, '"${HT_SRUN_ARGS[@]}"')]


def _site_render(tmp_path, template, sets=(), flags=None, runs_root="/shared/runs"):
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / "naive.sbatch.j2").write_text(template)
    spec, _ = resolve_job(None, site=NO_SITE, sets=[*NAIVE_BENIGN, *sets, "slurm.template=naive.sbatch.j2"],
                          flags=flags or {})
    return spec, render_sbatch(spec, runs_root=runs_root, python="/usr/bin/python3", site_dirs=[site_dir])


@pytest.mark.parametrize("line,advice", NAIVE_LINES, ids=[str(n) for n, _ in NAIVE_LINES])
def test_a_template_that_prints_a_job_value_is_refused_with_file_line_and_variable(tmp_path, line, advice):
    # Whatever the value (these are plain words) and wherever it lands: the template line alone is refused.
    text = NAIVE_TEMPLATE.splitlines()[line - 1]
    with pytest.raises(TemplateError, match=rf"naive\.sbatch\.j2:2: \{{\{{ .* \}}\}} prints a job value into the "
                                            rf"script; .*{re.escape(advice)}"):
        _site_render(tmp_path, f"#!/bin/bash\n{text}\nsrun true\n")


@pytest.mark.parametrize("value", ["gpu", "a b", "x;y", "$(id)", "`id`", "a'b", 'a"b', "a\\b", "*", "~root", "é€"])
def test_any_value_printed_is_refused_plain_words_too(tmp_path, value):
    with pytest.raises(TemplateError, match=r"naive\.sbatch\.j2:2: \{\{ job\.slurm\.partition \}\} prints a job value"):
        _site_render(tmp_path, "#!/bin/bash\nexport P={{ job.slurm.partition }}\nsrun true\n",
                     sets=[f"slurm.partition={json.dumps(value)}"])


def test_the_template_written_with_variables_runs_hostile_values_as_data(tmp_path):
    hostile = HOSTILE.replace("%", "")
    sets = [f"slurm.partition={json.dumps(hostile)}", f"slurm.modules={json.dumps(['ok', hostile])}",
            f"slurm.srun_args={json.dumps([hostile])}", f"slurm.env.FOO={json.dumps(hostile)}",
            f"slurm.venv={json.dumps(str(tmp_path / 'venv'))}"]
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("")
    spec, text = _site_render(tmp_path, VARIABLES_TEMPLATE, sets=sets, flags={"name": f"job {hostile}"},
                              runs_root=str(tmp_path / f"runs {hostile}"))
    stub_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    stub_dir.mkdir(), log_dir.mkdir()
    for tool in ("srun", "module"):
        (stub_dir / tool).write_text(STUB)
        (stub_dir / tool).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    result = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{stub_dir}:/usr/bin:/bin", "STUB_LOG": str(log_dir), "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "PWNED").exists()
    assert (log_dir / "module.argv").read_bytes().decode().split("\0")[:-1] == ["load", "ok", hostile]
    assert (log_dir / "srun.argv").read_bytes().decode().split("\0")[:-1] == [hostile, "/usr/bin/python3", "-m",
                                                                              "hpc_train.train"]
    assert f"running {spec.name} from {tmp_path}/runs {hostile}/{spec.name}" in result.stdout
    assert f"#SBATCH --partition={render.sbatch_value(hostile)}" in text.splitlines()


def test_the_old_quoting_filters_get_the_variable_message_too(tmp_path):
    # Site templates written with | shquote, | sbatch, | comment: the filters still exist, so the message says what
    # to read instead (not "no filter named shquote").
    for line, advice in [("#SBATCH --partition={{ job.slurm.partition | sbatch }}", '"$HT_PARTITION"'),
                         ("export P={{ job.slurm.partition | shquote }}", '"$HT_PARTITION"'),
                         ("module load {{ job.slurm.modules | map('shquote') | join(' ') }}", '"${HT_MODULES[@]}"'),
                         ("# {{ job.name | comment }}", '"$HT_NAME"'),
                         ("# {{ [job.slurm, job.slurm] | join(',', attribute='partition') }}", "no script variable")]:
        with pytest.raises(TemplateError, match=rf"naive\.sbatch\.j2:2: .* prints a job value into the script; "
                                                rf".*{re.escape(advice)}"):
            _site_render(tmp_path, f"#!/bin/bash\n{line}\nsrun true\n")


def test_a_variable_hpc_train_does_not_assign_is_refused(tmp_path):
    with pytest.raises(TemplateError, match=r"naive\.sbatch\.j2: reads \$HT_PARTITON, which hpc-train does not assign"):
        _site_render(tmp_path, '#!/bin/bash\n{{ job_variables }}\necho "$HT_PARTITON"\nsrun true\n')


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
        "#!/bin/bash\n# SITE TEMPLATE\n{{ sbatch_header }}\n"
        "srun true\n")
    spec, _ = resolve_job(None, site=NO_SITE)
    text = render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[site_dir])
    assert "# SITE TEMPLATE" in text and "#SBATCH --nodes=1" in text and "# digits-lt-demo: rendered by" in text
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


def test_undefined_variable_names_file_and_line(tmp_path):
    (tmp_path / "undef.sbatch.j2").write_text("#!/bin/bash\n# ok\necho {{ job.slurm.no_such_field }}\n")
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=undef.sbatch.j2"])
    with pytest.raises(TemplateError, match=r"undef\.sbatch\.j2:3: .*no_such_field"):
        render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path])


def test_template_not_found_shows_search_path(tmp_path):
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=missing.sbatch.j2"])
    with pytest.raises(TemplateError, match=f"'missing.sbatch.j2' not found; search path: {tmp_path}, "):
        render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path])


def test_the_job_yaml_is_written_as_it_is_whatever_lines_it_holds(tmp_path):
    # The heredoc's end marker is gone: the job's YAML is a variable, so no line of it (an old marker, EOF, quotes)
    # can end it early. Its bytes, as bash writes them, are the job exactly.
    spec, _ = resolve_job(None, site=NO_SITE, sets=['slurm.env.X="a\\nHPC_TRAIN_JOB_ABABABABABAB\\nEOF\\n\'\\n"'])
    script = render_sbatch(spec, runs_root="/r", python="python3")
    preamble = script[script.index("readonly "):script.index("# Stop at the first failing")]
    written = subprocess.run(["bash", "-c", preamble + 'printf %s "$HT_JOB_YAML"'], capture_output=True, text=True,
                             check=True).stdout
    assert written == config.dump_yaml(spec) and "EOF\n'" in spec.slurm.env["X"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_site_template_of_the_previous_release_defines_the_run_file_helpers_its_partials_call(variant):
    # A site's default.sbatch.j2 copied from an earlier release includes run_dir.j2 or launch_packed.j2 but not
    # run_files.j2 (it did not exist): those partials bring the helpers they call, or the job dies on its node with
    # "run_logs_dir: command not found" before any state is written. The package's template includes them the same way.
    assert "run_files.j2" not in (render.templates_dir() / "default.sbatch.j2").read_text()
    text = render_variant(variant)
    called = set(re.findall(r"\b(run_(?:logs_dir|file_write|file_append))\b(?!\(\))", text))
    assert called, "the script calls none of the run-file helpers"
    for name in called:
        defined = text.find(f"{name}() {{")
        assert 0 <= defined < text.find(f"{name} "), f"{name} called before it is defined"
