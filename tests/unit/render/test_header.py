"""hpc_train/render/header.py on its own: the comment lines and the ``#SBATCH`` lines Python writes, each from the
field that declares it, then the launch's, then ``slurm.extra_sbatch``'s; values quoted as sbatch reads them."""

from __future__ import annotations

import shlex

import pytest

from hpc_train.config import replace, resolve_job
from hpc_train.config.layers import NO_SITE
from hpc_train.errors import TemplateError
from hpc_train.render.header import comment, describe, header, sbatch_line, sbatch_lines, sbatch_value
from hpc_train.render.script import LaunchSpec


def job(*sets, **flags):
    spec, _ = resolve_job(None, site=NO_SITE, sets=list(sets), flags=flags)
    return spec


@pytest.mark.parametrize("value, written", [
    ("gpu", "gpu"), ("a b", "'a b'"), ("a'b", "'a'\"'\"'b'"), ("$(id)", "'$(id)'"), (8, "8"),
    ("a\\b", "'a\\\\b'"),  # sbatch reads a backslash as an escape, inside quotes too: doubled
])
def test_a_value_is_one_word_as_sbatch_reads_it(value, written):
    assert sbatch_value(value) == written


@pytest.mark.parametrize("value", ["a\nb", "a\rb"])
def test_a_newline_cannot_be_carried(value):
    with pytest.raises(TemplateError, match="contains a newline"):
        sbatch_value(value)


def test_an_option_is_a_line_and_a_flag_is_bare():
    assert sbatch_line("--partition=a b") == "#SBATCH --partition='a b'"
    assert sbatch_line("--exclusive") == "#SBATCH --exclusive"
    assert sbatch_line("--comment=x=y") == "#SBATCH --comment=x=y"  # the first = separates


def test_a_comment_is_one_line():
    assert comment("my  job\nname") == "'my job name'"
    assert comment("plain") == "plain"


def test_the_description_says_the_shape_and_what_runs():
    spec = job(name="demo", **{"slurm.nodes": 2, "slurm.gpus_per_node": 4})
    lines = describe(spec, "default.sbatch.j2")
    assert lines[0].startswith("# demo: rendered by hpc-train ") and lines[0].endswith(" from default.sbatch.j2")
    assert lines[1] == "# 2 node(s) x 4 rank(s) = 8 rank(s), launcher srun"
    assert lines[2].startswith("# BatchNorm: ")
    command = describe(job(command=("python", "train.py", "it's")), "t.j2")
    assert command[2].endswith(shlex.quote("python train.py it's"))


def test_the_lines_come_in_field_order_then_launch_then_extra_sbatch():
    spec = job("slurm.partition=a100", "slurm.exclusive=true", "slurm.extra_sbatch={mail-type: END, hint: nomultithread,"
               " requeue-ish: true, off: false}", name="order")
    lines = sbatch_lines(spec, LaunchSpec(stdout="o.out", stderr="e.out", array="0-2%1"))
    keys = [line.split()[1].split("=")[0] for line in lines]
    assert keys[0] == "--job-name" and keys.index("--nodes") < keys.index("--partition") < keys.index("--exclusive")
    assert keys[-7:] == ["--output", "--error", "--open-mode", "--array", "--hint", "--mail-type", "--requeue-ish"]
    assert "#SBATCH --output=o.out" in lines and "#SBATCH --array=0-2%1" in lines
    assert all(line.startswith("#SBATCH ") for line in lines) and "--off" not in " ".join(lines)


def test_unset_fields_write_no_line():
    lines = sbatch_lines(job(), LaunchSpec())
    assert not any(line.startswith(("#SBATCH --partition", "#SBATCH --account", "#SBATCH --exclusive",
                                    "#SBATCH --array")) for line in lines)


def test_a_field_line_carries_its_unit_and_quoting():
    lines = sbatch_lines(job("slurm.mem_gb=64", "slurm.account=a'b"), LaunchSpec())
    assert "#SBATCH --mem=64G" in lines and "#SBATCH --account='a'\"'\"'b'" in lines


def test_the_header_is_the_description_then_the_lines():
    spec = replace(job(name="h"), runs_dir="r")
    text = header(spec, LaunchSpec(), "default.sbatch.j2")
    assert text.endswith("\n") and text.splitlines() == [*describe(spec, "default.sbatch.j2"),
                                                          *sbatch_lines(spec, LaunchSpec())]
