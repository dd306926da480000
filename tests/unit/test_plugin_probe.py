"""hpc_train/plugin_probe.py: the plug-in probe of ``submit --dry-run``, one function from a job's ``train:``
section to the lines the dry run prints, errors as ConfigError. The plug-ins are real modules the tests write
and the probe imports from the working directory, as the CLI does."""

from __future__ import annotations

import sys

import pytest

from hpc_train.config import NO_SITE, resolve
from hpc_train.errors import ConfigError
from hpc_train.plugin_probe import probe_counts, probe_plugins

PLUGINS = '''
def backbone(num_classes, in_channels, width=12):
    return ("a backbone", width)


def table(config, rows=3):
    return ["rows"] * rows


def per_sample_ce(counts, scale=1.0):
    import torch.nn.functional as F

    return lambda logits, target: scale * F.cross_entropy(logits, target, reduction="none")


def mean_ce(counts):
    import torch.nn.functional as F

    return lambda logits, target: F.cross_entropy(logits, target)  # wrong: one value, not one per sample
'''


@pytest.fixture
def probeplug(tmp_path, monkeypatch):
    """A package ``probeplug`` in the working directory (where the ranks import plug-ins from)."""
    (tmp_path / "probeplug").mkdir()
    (tmp_path / "probeplug" / "__init__.py").write_text("")
    (tmp_path / "probeplug" / "parts.py").write_text(PLUGINS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    for name in [n for n in sys.modules if n == "probeplug" or n.startswith("probeplug.")]:
        del sys.modules[name]


def train_section(*sets: str):
    return resolve(None, site=NO_SITE, sets=list(sets)).spec.train


def test_a_job_without_plugins_probes_nothing():
    assert probe_plugins(train_section()) == []


def test_each_plugin_is_imported_and_its_call_bound(probeplug):
    lines = probe_plugins(train_section("train.model.name=probeplug.parts:backbone", "train.model.args.width=8",
                                        "train.data.name=probeplug.parts:table"))
    assert lines == [
        "plug-in data probeplug.parts:table(): imports, arguments match; returns a "
        "hpc_train.train.data.datasets.DataSource",
        "plug-in model probeplug.parts:backbone(width=8): imports, arguments match; returns a feature backbone: "
        "an nn.Module with a feature_dim attribute, or (module, feature_dim)",
    ]
    assert str(probeplug) in sys.path  # imported from the submit directory, though a console script omits it


@pytest.mark.parametrize(("sets", "words"), [
    (["train.model.name=probeplug.nowhere:backbone"], "train.model.name: cannot import 'probeplug.nowhere'"),
    (["train.model.name=probeplug.parts:nothing"], "train.model.name: 'probeplug.parts' has no 'nothing'"),
    (["train.model.name=probeplug.parts:backbone", "train.model.args.depth=3"],
     "unexpected keyword argument 'depth'"),
    (["train.data.name=probeplug.parts:table", "train.data.args.config=1"],
     "train.data.args: config is passed by hpc-train itself"),
])
def test_a_plugin_that_cannot_be_called_so_is_a_config_error(probeplug, sets, words):
    with pytest.raises(ConfigError) as refused:
        probe_plugins(train_section(*sets))
    assert words in str(refused.value)


def test_probe_counts_follow_the_data_configs_long_tail():
    digits = probe_counts(train_section("train.data.imbalance_factor=10"))
    assert len(digits) == 10 and digits[0] == 100 and digits[-1] == 10 and digits == sorted(digits, reverse=True)
    synthetic = probe_counts(train_section("train.data.name=synthetic-lt", "train.data.num_classes=7"))
    assert len(synthetic) == 7
    listed = train_section("train.data.name=list", "train.data.root=/data", "train.data.train_list=t.txt",
                           "train.data.test_list=v.txt")
    assert probe_counts(listed) is None


def test_a_loss_plugin_is_called_on_a_probe_batch(probeplug):
    pytest.importorskip("torch")
    (line,) = probe_plugins(train_section("train.loss.name=probeplug.parts:per_sample_ce"))
    assert line.endswith("called on 4 x 10 logits: per-sample values of shape (4,)")
    listed = train_section("train.loss.name=probeplug.parts:per_sample_ce", "train.data.name=list",
                           "train.data.root=/data", "train.data.train_list=t.txt", "train.data.test_list=v.txt")
    assert "not called here (the data set tells its classes when read" in probe_plugins(listed)[0]


def test_a_loss_plugin_giving_one_value_is_refused(probeplug):
    pytest.importorskip("torch")
    with pytest.raises(ConfigError, match=r"must return per-sample values of shape \(4,\).*got \(\)"):
        probe_plugins(train_section("train.loss.name=probeplug.parts:mean_ce"))


def test_without_torch_the_loss_is_imported_and_bound_but_not_called(probeplug, monkeypatch):
    monkeypatch.setitem(sys.modules, "hpc_train.train.model.losses", None)  # importing it raises ImportError
    (line,) = probe_plugins(train_section("train.loss.name=probeplug.parts:mean_ce"))
    assert line.endswith("not called here (no torch: train --dry-run on a compute node calls it)")
