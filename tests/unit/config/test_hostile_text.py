"""Text a job cannot hold is refused where it is read, exit 2 in one line (review of issue 19, M6, M7, N4): a
control character YAML does not allow (PyYAML's reader raised it before the error handling, a 54-line
traceback), a lone surrogate (YAML's "\\ud800", a byte of argv that is not UTF-8: a traceback when the script or
a run file was written), and a newline in a --set value is kept as typed (YAML folded it into a space)."""

import os
import re

import pytest

from hpc_train.config import NO_SITE, ConfigError, resolve
from hpc_train.config.yaml_text import parse_mapping
from tests.cli_helpers import assert_refused, cli, tree

CONTROL = ["\x1b", "\x01", "\x7f", "\x9b"]


@pytest.mark.parametrize("ch", CONTROL, ids=[f"{ord(c):#04x}" for c in CONTROL])
def test_a_control_character_in_a_file_or_a_set_value_is_refused(ch):
    with pytest.raises(ConfigError, match=r"job\.yaml:2:21: holds the control character " + re.escape(repr(ch))):
        parse_mapping(f"name: x\nslurm: {{partition: a{ch}b}}\n", "job.yaml")
    for sets in ([f"slurm.partition=a{ch}b"], [f"slurm.env.X=[a, '{ch}']"]):
        with pytest.raises(ConfigError, match="holds the control character"):
            resolve(None, site=NO_SITE, sets=sets)
    with pytest.raises(ConfigError, match="holds the control character"):
        resolve(None, site=NO_SITE, sweeps=[f"train.seed=1,{ch}"])


@pytest.mark.parametrize("sets", [['slurm.partition="a\\ud800b"'], ["slurm.partition=a\udcffb"],
                                  ['slurm.env.X="\\udfff"'], ['name="\\ud83d"']],
                         ids=["yaml-escape", "argv-byte", "env-value", "name"])
def test_a_lone_surrogate_is_refused(sets):
    with pytest.raises(ConfigError, match="not UTF-8|lone surrogate"):
        resolve(None, site=NO_SITE, sets=sets)


def test_a_lone_surrogate_in_a_file_and_from_a_flag_is_refused():
    with pytest.raises(ConfigError, match=r"job\.yaml:1:20: a value holds '\\ud800', a lone surrogate"):
        parse_mapping('slurm: {partition: "a\\ud800b"}\n', "job.yaml")
    with pytest.raises(ConfigError, match=r"job\.yaml:1:15: a value holds '\\udfff'"):
        parse_mapping('slurm: {env: {"\\udfff": a}}\n', "job.yaml")  # a key too
    with pytest.raises(ConfigError, match="name: a value holds the byte 0xff, which is not UTF-8"):
        resolve(None, site=NO_SITE, flags={"name": "a\udcffb"})


def test_the_cli_refuses_them_exit_2_nothing_written(tmp_path):
    (tmp_path / "ctl.yaml").write_bytes(b"name: a\x1bb\n")
    (tmp_path / "sur.yaml").write_text('slurm: {partition: "a\\ud800b"}\n')
    (tmp_path / "site.yaml").write_bytes(b"slurm: {qos: a\x01b}\n")
    before = tree(tmp_path)
    cases = [(["render", "ctl.yaml"], "ctl.yaml:1:8: holds the control character '\\x1b'"),
             (["render", "-o", "out.sbatch", "sur.yaml"], "lone surrogate"),
             (["render", "--set", "slurm.partition=a\udcffb"], "holds the byte 0xff, which is not UTF-8"),
             (["submit", "--cluster", "local", "sur.yaml"], "lone surrogate")]
    for args, message in cases:
        assert_refused(cli(*args, cwd=tmp_path), message)
    env = {"HPC_TRAIN_SITE": "site.yaml", "HOME": str(tmp_path), "PATH": os.environ["PATH"],
           "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HPC_TRAIN_STATE_DIR": str(tmp_path / "state")}
    assert_refused(cli("render", cwd=tmp_path, env=env), "site.yaml:1:15: holds the control")
    assert tree(tmp_path) == before


def test_a_newline_in_a_set_value_is_kept_as_typed_not_folded():
    with pytest.raises(ConfigError, match=r"slurm.partition: 'a\\nb' contains a newline"):
        resolve(None, site=NO_SITE, sets=["slurm.partition=a\nb"])
    spec = resolve(None, site=NO_SITE, sets=["slurm.env.MSG=two\nlines", "slurm.modules=[a,\n b]"]).spec
    assert spec.slurm.env["MSG"] == "two\nlines" and spec.slurm.modules == ("a", "b")
