"""hpc_train/render/variables.py on its own: every job value a script reads, assigned once to a read-only ``HT_``
variable, each one shell word (arrays as bash arrays); only the variables a script reads are written; and the
catalogue the refusal's advice comes from names variables that are assigned."""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.config import resolve_job
from hpc_train.config.layers import NO_SITE
from hpc_train.render import variables
from hpc_train.render.script import LaunchSpec
from hpc_train.render.variables import (EXPRESSIONS, assignment, container_exec, exports, job_values, preamble,
                                        srun_options, used_names, variable_for)

HOSTILE = "a b'c\"d $(touch PWNED) `id` ;|&\n\\ é"


def job(*sets, **flags):
    spec, _ = resolve_job(None, site=NO_SITE, sets=list(sets), flags=flags)
    return spec


def values_of(spec, launch=None, **over):
    arguments = dict(runs_root="/runs", run_group="/runs/g", python="python3", launch=launch or LaunchSpec(),
                     job_yaml="name: x\n", point_yamls=[], sweep_points=0, container_binds=[])
    return job_values(spec, **{**arguments, **over})


def bash(script: str, cwd) -> str:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_an_int_is_bare_text_is_one_word_and_a_list_is_an_array(tmp_path):
    assert assignment("HT_NODES", 4) == "readonly HT_NODES=4"
    assert assignment("HT_VENV_ACTIVATE", None) == "readonly HT_VENV_ACTIVATE=''"
    lines = "\n".join([assignment("HT_S", HOSTILE), assignment("HT_A", ["x y", HOSTILE])])
    out = bash(lines + '\nprintf "<%s>" "$HT_S" "${HT_A[@]}"', tmp_path)
    assert out == f"<{HOSTILE}><x y><{HOSTILE}>" and not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", [True, 1.5, {"a": 1}])
def test_only_text_ints_and_lists_are_variables(value):
    # A bool or a float is a choice of structure or not a schema int: never written bare where $(( )) may read it.
    with pytest.raises(TypeError):
        assignment("HT_X", value)


@pytest.mark.parametrize("value, change", [("x", "HT_V=y"), (["x"], "HT_V+=(y)")])
def test_a_variable_is_read_only(tmp_path, value, change):
    result = subprocess.run(["bash", "-c", assignment("HT_V", value) + "\n" + change], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode != 0 and "readonly" in result.stderr


def test_the_preamble_writes_only_what_the_script_reads_in_catalogue_order():
    values = {"HT_NAME": "n", "HT_NODES": 2, "HT_PARTITION": None, "HT_JOB_YAML": "a: 1\n"}
    text = preamble(values, used_names('echo "$HT_JOB_YAML" "${HT_NAME}" $HT_NODES'))
    assignments = [line for line in text.splitlines() if line.startswith("readonly")]
    assert assignments == ["readonly HT_NAME=n", "readonly HT_NODES=2", "readonly HT_JOB_YAML='a: 1"]
    assert preamble(values, set()) == ""


def test_a_value_with_a_dollar_gets_shellchecks_data_note():
    text = preamble({"HT_NAME": "$(x)", "HT_NODES": 1}, {"HT_NAME", "HT_NODES"})
    lines = text.splitlines()
    assert lines[lines.index("readonly HT_NAME='$(x)'") - 1] == "# shellcheck disable=SC2016"
    assert lines[lines.index("readonly HT_NODES=1") - 1] != "# shellcheck disable=SC2016"


def test_used_names():
    assert used_names('x "$HT_A" ${HT_B[@]} $HT_C_2 HTX $ht_d') == {"HT_A", "HT_B", "HT_C_2"}


@pytest.mark.parametrize("expression, name", [
    ("job.name", "HT_NAME"), ("job.slurm.partition", "HT_PARTITION"), ("job.slurm.modules", "@HT_MODULES"),
    ("(job.slurm.nodes * 2)", "HT_NODES"), ("job.slurm.partition | upper", "HT_PARTITION"),
    ("job.slurm.env.NCCL_DEBUG", "NCCL_DEBUG"), ("launch.command", "@HT_LAUNCH_COMMAND"),
    ("job.train.epochs", None), ("job.slurm.exclusive", None), ("'literal'", None),
])
def test_variable_for(expression, name):
    assert variable_for(expression) == name


def test_every_variable_the_advice_names_is_assigned():
    assigned = set(values_of(job()))
    advised = {name.lstrip("@") for name in EXPRESSIONS.values()}
    assert advised - assigned == set()


def test_job_values_hold_the_job_and_the_launch():
    spec = job("slurm.modules=[cuda, nccl]", "slurm.venv=/v", name="n", **{"slurm.nodes": 4})
    launch = LaunchSpec(command="python -u -m submitit.core._submit '/a b'", run_dir="/runs/g/7", point_offset=4)
    values = values_of(spec, launch, point_yamls=["p0", "p1"], sweep_points=6)
    assert values["HT_NAME"] == "n" and values["HT_NODES"] == 4 and values["HT_MODULES"] == ("cuda", "nccl")
    assert values["HT_VENV_ACTIVATE"] == "/v/bin/activate" and values["HT_CONTINUE_RUN_DIR"] == "/runs/g/7"
    assert values["HT_LAUNCH_COMMAND"] == ["python", "-u", "-m", "submitit.core._submit", "/a b"]
    assert (values["HT_POINT_COUNT"], values["HT_POINT_YAMLS"], values["HT_SWEEP_POINTS"]) == (2, ["p0", "p1"], 6)
    assert values["HT_POINT_OFFSET"] == 4 and list(values)[-1] == "HT_JOB_YAML"  # the long one last
    for name, value in values.items():
        assignment(name, value)  # each one is a variable bash can hold


def test_srun_options_and_container_words():
    plain = job("slurm.srun_args=[--mpi=pmix]", "slurm.cpu_bind=cores")
    assert srun_options(plain, []) == ["--cpu-bind=cores", "--mpi=pmix"] and container_exec(plain, []) == []
    pyxis = job("slurm.container={runtime: pyxis, image: 'nvcr.io#x'}", "slurm.venv=null")
    assert srun_options(pyxis, ["/d", "/r"])[-2:] == ["--container-image=nvcr.io#x", "--container-mounts=/d,/r"]
    apptainer = job("slurm.container={image: /i.sif}", "slurm.venv=null")
    assert container_exec(apptainer, ["/d"]) == ["apptainer", "exec", "--nv", "--bind", "/d", "/i.sif"]


def test_exports_are_sorted_and_quoted(tmp_path):
    text = exports({"B": HOSTILE, "A": "1"})
    assert text.splitlines()[0] == "export A=1"
    assert bash(text + 'printf "%s" "$B"', tmp_path) == HOSTILE and not (tmp_path / "PWNED").exists()


def test_the_prefix():
    assert variables.PREFIX == "HT_" and all(name.lstrip("@").startswith("HT_") for name in EXPRESSIONS.values())
