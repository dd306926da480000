"""hpc_train/config/layers.py on its own: built-in defaults < site file < job file < --set < explicit flags, each
layer checked on its own, merged key by key; the site file's template_dirs; the job as YAML and back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpc_train.config import JobSpec
from hpc_train.config.layers import (SITE_ENV, deep_merge, dotted_to_nested, dump_yaml, job_path, load_site, parse_set,
                                     resolve, spec_from_yaml_text)
from hpc_train.config.yaml_text import Scalar
from hpc_train.errors import ConfigError
from hpc_train.resources import jobs_dir


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site file of the test's own (never the machine's), empty until the test writes it."""
    path = tmp_path / "site.yaml"
    path.write_text("{}\n")
    monkeypatch.setenv(SITE_ENV, str(path))
    return path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_deep_merge_merges_mappings_and_replaces_the_rest():
    base = {"slurm": {"nodes": 1, "modules": ["a"]}, "name": "x"}
    merged = deep_merge(base, {"slurm": {"modules": ["b"], "qos": "q"}})
    assert merged == {"slurm": {"nodes": 1, "modules": ["b"], "qos": "q"}, "name": "x"}
    assert base == {"slurm": {"nodes": 1, "modules": ["a"]}, "name": "x"}  # the layers below are not changed


def test_dotted_to_nested():
    assert dotted_to_nested("train.loss.name", "ce") == {"train": {"loss": {"name": "ce"}}}


def test_parse_set_checks_the_key_and_keeps_the_value_as_written():
    key, value = parse_set("train.amp=off")
    assert key == "train.amp" and isinstance(value, Scalar) and value.text == "off"
    for bad, says in (("train.epochs", "expected KEY=VALUE"), ("=3", "empty key"), ("train.epoch=3", "unknown key")):
        with pytest.raises(ConfigError, match=says):
            parse_set(bad)


def test_each_layer_overrides_the_one_below(site, tmp_path):
    write(site, "slurm: {partition: site-part, qos: site-qos, account: site-acct}\n")
    job = write(tmp_path / "job.yaml", "name: layered\nslurm: {qos: job-qos, account: job-acct}\n"
                                       "train: {epochs: 3}\n")
    spec = resolve(job, sets=["slurm.account=set-acct"], flags={"slurm.nodes": 2, "slurm.qos": None}).spec
    assert (spec.slurm.partition, spec.slurm.qos, spec.slurm.account) == ("site-part", "job-qos", "set-acct")
    assert spec.slurm.nodes == 2  # a flag left unset (None) changes nothing
    assert (spec.name, spec.train.epochs) == ("layered", 3)


def test_gpus_alone_means_one_rank_per_gpu(site, tmp_path):
    job = write(tmp_path / "job.yaml", "name: g\nslurm: {gpus_per_node: 2, tasks_per_node: 2}\n")
    assert resolve(job).spec.slurm.ranks_per_node == 2
    assert resolve(job, flags={"slurm.gpus_per_node": 8}).spec.slurm.ranks_per_node == 8


def test_a_layer_with_an_unknown_key_is_named(site, tmp_path):
    write(site, "slurm: {nodez: 2}\n")
    with pytest.raises(ConfigError, match=rf"site file {site}: unknown key 'slurm.nodez'"):
        resolve(None)


def test_an_empty_job_file_is_refused(site, tmp_path):
    with pytest.raises(ConfigError, match="is empty"):
        resolve(write(tmp_path / "empty.yaml", ""))


def test_a_shipped_job_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert job_path("digits_lt_demo") == jobs_dir() / "digits_lt_demo.yaml"
    assert job_path("no_such_job") == Path("no_such_job")  # reading it says "not found" with the path
    assert job_path(None) is None


def test_no_job_is_the_default_job(site):
    resolved = resolve(None)
    assert resolved.sources.job_file == jobs_dir() / "digits_lt_demo.yaml"
    assert resolved.sources.site_file == site


def test_site_template_dirs_are_relative_to_the_site_file(site, tmp_path):
    (tmp_path / "templates").mkdir()
    write(site, "template_dirs: [templates]\nslurm: {partition: p}\n")
    loaded = load_site()
    assert loaded.template_dirs == (tmp_path / "templates",)
    assert loaded.defaults["slurm"]["partition"].text == "p"
    write(site, "template_dirs: [missing]\n")
    with pytest.raises(ConfigError, match="template_dirs entry 'missing'.*does not exist"):
        load_site()


def test_a_named_site_file_that_is_missing_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(SITE_ENV, str(tmp_path / "nowhere.yaml"))
    with pytest.raises(ConfigError, match=r"site file not found: .*nowhere\.yaml"):
        load_site()


def test_the_job_as_yaml_reads_back_as_the_same_job(site, tmp_path):
    job = write(tmp_path / "job.yaml", "name: 'round trip: 1'\nslurm: {modules: [cuda/12.4, '1e5']}\n"
                                       "train: {loss: {name: 'pkg.mod:loss', args: {scale: '1e5', n: 3}}}\n")
    spec = resolve(job).spec
    text = dump_yaml(spec)
    assert spec_from_yaml_text(text, "job.yaml") == spec
    # Text an open field would read back as a number is quoted; a number stays a number.
    assert yaml.safe_load(text)["train"]["loss"]["args"] == {"scale": "1e5", "n": 3}
    assert "scale: '1e5'" in text


def test_dump_yaml_keeps_the_schema_order(site):
    spec = resolve(None).spec
    assert list(yaml.safe_load(dump_yaml(spec))) == list(spec.to_dict()) == [f for f in JobSpec.__dataclass_fields__]
