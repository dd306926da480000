"""hpc_train/plugin_loading.py: a plug-in imported by its import path and the call hpc-train makes bound to its
signature, torch-free, for the dry-run's probe and the trainer's adapters alike."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpc_train import plugin_loading
from hpc_train.errors import ConfigError

MODULE = '''
def build(num_classes, in_channels, width=12):
    return {"classes": num_classes, "channels": in_channels, "width": width}


class Factory:
    @staticmethod
    def build(counts):
        return counts


NOT_CALLABLE = 3
'''


@pytest.fixture
def loadplug(tmp_path, monkeypatch):
    (tmp_path / "loadplug.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("loadplug", None)


def test_call_passes_hpc_trains_keywords_and_the_jobs_args(loadplug):
    made = plugin_loading.call("loadplug:build", "model", {"width": 5}, num_classes=10, in_channels=3)
    assert made == {"classes": 10, "channels": 3, "width": 5}


def test_a_dotted_attribute_is_followed(loadplug):
    assert plugin_loading.load("loadplug:Factory.build", "loss")([1, 2]) == [1, 2]


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("loadplug_missing:build", "data", "train.data.name: cannot import 'loadplug_missing' (ModuleNotFoundError"),
    ("loadplug:Factory.nothing", "loss", "train.loss.name: 'loadplug' has no 'Factory.nothing'"),
    ("loadplug:NOT_CALLABLE", "model", "train.model.name: loadplug:NOT_CALLABLE is not callable (int)"),
])
def test_what_cannot_be_loaded_is_a_config_error_naming_the_key(loadplug, name, kind, words):
    with pytest.raises(ConfigError) as refused:
        plugin_loading.load(name, kind)
    assert words in str(refused.value)


@pytest.mark.parametrize(("args", "words"), [
    ({"depth": 3}, "unexpected keyword argument 'depth'"),
    ({"num_classes": 3}, "train.model.args: num_classes is passed by hpc-train itself; remove it"),
])
def test_arguments_that_do_not_bind_are_a_config_error(loadplug, args, words):
    function = plugin_loading.load("loadplug:build", "model")
    with pytest.raises(ConfigError) as refused:
        plugin_loading.check_arguments(function, "model", args, "loadplug:build")
    assert words in str(refused.value)


def test_a_callable_without_a_signature_is_not_checked():
    plugin_loading.check_arguments(max, "loss", {"anything": 1}, "builtins:max")  # C code: the call will tell


def test_loading_imports_no_torch():
    code = "import sys, hpc_train.plugin_loading, hpc_train.plugin_probe; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
