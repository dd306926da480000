"""Job files are data, read as written: text fields get the exact text, bool fields yes/no/on/off, numbers
are finite and bounded, duplicate keys and tags are refused, sweeps stay typed, only small regular files
are read."""

import textwrap

import pytest

from hpc_train import config
from hpc_train.config import NO_SITE, ConfigError, resolve, resolve_job, sweep_points


def job(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_text_fields_get_the_text_as_written(tmp_path):
    spec, _ = resolve_job(job(tmp_path, """
        name: 010
        slurm:
          partition: 0x10
          qos: on
          env: {OCT: 010, HEX: 0x10, ON: on, BIG: 1_000, TIME: 1:30:00, YES: Yes, FLOAT: 1.50, Q: '007'}
        """), site=NO_SITE)
    assert spec.name == "010" and spec.slurm.partition == "0x10" and spec.slurm.qos == "on"
    assert dict(spec.slurm.env) == {"OCT": "010", "HEX": "0x10", "ON": "on", "BIG": "1_000", "TIME": "1:30:00",
                                    "YES": "Yes", "FLOAT": "1.50", "Q": "007"}
    # What the ranks read back from the script's HT_JOB_YAML is the same job.
    assert config.spec_from_yaml_text(config.dump_yaml(spec), "round trip") == spec


@pytest.mark.parametrize("written", ["off", "'off'"])
def test_amp_off_as_documented(tmp_path, written):
    spec, _ = resolve_job(job(tmp_path, f"train:\n  amp: {written}\n"), site=NO_SITE)
    assert spec.train.amp == "off"
    spec, _ = resolve_job(None, site=NO_SITE, sets=["train.amp=off", "slurm.env.FOO=010"])
    assert spec.train.amp == "off" and spec.slurm.env["FOO"] == "010"


@pytest.mark.parametrize("word,value", [("yes", True), ("no", False), ("on", True), ("off", False), ("True", True),
                                        ("FALSE", False)])
def test_bool_fields_accept_yaml_words(tmp_path, word, value):
    spec, _ = resolve_job(job(tmp_path, f"slurm:\n  exclusive: {word}\n"), site=NO_SITE)
    assert spec.slurm.exclusive is value


def test_extra_sbatch_values_are_text_or_flags(tmp_path):
    spec, _ = resolve_job(job(tmp_path, "slurm:\n  extra_sbatch: {nice: 010, hint: nomultithread, "
                                        "overcommit: true, spread-job: false}\n"), site=NO_SITE)
    assert dict(spec.slurm.extra_sbatch) == {"nice": "010", "hint": "nomultithread", "overcommit": True,
                                             "spread-job": False}


@pytest.mark.parametrize("text,message", [
    ("slurm:\n  nodes: 1\nslurm:\n  nodes: 2\n", "job.yaml:3:1: duplicate key 'slurm' (first at "),
    ("slurm:\n  env: {A: 1, A: 2}\n", "duplicate key 'A'"),
    ("slurm:\n  nodes: 0x10\n", "slurm.nodes: must be an integer, got '0x10'"),
    ("slurm:\n  nodes: '4'\n", "slurm.nodes: must be an integer, got '4'"),
    ("slurm:\n  exclusive: maybe\n", "slurm.exclusive: must be true or false (yes/no, on/off), got 'maybe'"),
    ("name: !!python/object/apply:os.system [touch PWNED]\n", "YAML tags"),
    ("slurm:\n  partition: \"a\\0b\"\n", "NUL byte"),
    ("train:\n  optim: {lr: .nan}\n", "train.optim.lr: must be a finite number, got '.nan'"),
    ("train:\n  data: {imbalance_factor: .inf}\n", "must be a finite number, got '.inf'"),
    ("train:\n  optim: {lr: 1e999}\n", "train.optim.lr: must be a finite number, got inf"),
    ("slurm:\n  nodes: 100000000000000000000\n", "slurm.nodes: 100000000000000000000 is out of range"),
    ("slurm:\n  nodes: 200000\n", "slurm.nodes must be between 1 and 100,000"),
    ("slurm:\n  time: 99999-00:00:00\n", "is more than a year"),
    ("slurm:\n  extra_sbatch: {nodes: 4}\n", "'nodes' is written by hpc-train itself; use slurm.nodes (--nodes)"),
    ("slurm:\n  extra_sbatch: {wrap: 'rm -rf ~'}\n", "'wrap' is written by hpc-train itself"),
    ("slurm:\n  extra_sbatch: {output: /tmp/x}\n", "'output' is written by hpc-train itself"),
    ("slurm:\n  extra_sbatch: {N: 4}\n", "'N' is not a long sbatch option name"),
    ("name: run%j\n", "no '/', '%'"),
    ("runs_dir: runs/%u\n", "runs_dir: 'runs/%u' cannot hold '%'"),
    ("name: " + "x" * 300 + "\n", "name: 300 characters; a job name has at most 128"),
])
def test_refused(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        resolve_job(job(tmp_path, text), site=NO_SITE)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_merge_keys_and_anchors_still_work(tmp_path):
    spec, _ = resolve_job(job(tmp_path, """
        slurm:
          env: &common {A: x}
          extra_sbatch: {<<: {mail-type: END}, comment: y}
        train:
          data: {root: &r /data}
          loss: {name: ce}
        """), site=NO_SITE)
    assert dict(spec.slurm.env) == {"A": "x"} and spec.slurm.extra_sbatch["mail-type"] == "END"


def test_sweep_values_stay_typed():
    # "yes" and "null" over a text field are that text; null over an optional field is unset.
    assert sweep_points(["train.data.root=yes,null"]) == [{"train.data.root": "yes"}, {"train.data.root": "null"}]
    assert sweep_points(["train.data.train_list=null,a.txt"]) == [{"train.data.train_list": None},
                                                                  {"train.data.train_list": "a.txt"}]
    specs = resolve(None, sweeps=["train.data.root=yes,010", "train.amp=off,bf16"], site=NO_SITE).sweep
    assert [(s.train.data.root, s.train.amp) for s in specs] == [("yes", "off"), ("yes", "bf16"), ("010", "off"),
                                                                  ("010", "bf16")]


def test_sweep_size_is_bounded_before_anything_is_built():
    with pytest.raises(ConfigError, match="20,001 sweep points; a sweep holds at most 10,000"):
        sweep_points(["train.seed=[" + ",".join(map(str, range(20001))) + "]"])
    with pytest.raises(ConfigError, match="10,100 sweep points"):  # a grid counted before it is made
        sweep_points(["train.seed=" + ",".join(map(str, range(101))), "train.data.seed=" + ",".join(map(str, range(100)))])
    assert len(sweep_points(["train.seed=" + ",".join(map(str, range(100))), "train.data.seed=" + ",".join(
        map(str, range(100)))])) == 10_000


@pytest.mark.parametrize("make,message", [
    (lambda tmp: "/dev/zero", "is not a regular file"),
    (lambda tmp: str(tmp), "is a directory"),
    (lambda tmp: _big(tmp), "a job file is at most 1024 KiB"),
    (lambda tmp: _binary(tmp), "not UTF-8 text"),
])
def test_only_small_regular_text_files_are_read(tmp_path, make, message):
    with pytest.raises(ConfigError, match=message):
        resolve_job(config.job_path(make(tmp_path)), site=NO_SITE)


def _big(tmp):
    path = tmp / "big.yaml"
    path.write_text("# " + "x" * (2 << 20) + "\n")
    return str(path)


def _binary(tmp):
    path = tmp / "bin.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    return str(path)
