"""Plug-ins are probed in a child process with a deadline (issue 28, item 6): a module that calls sys.exit at
import, prints forever, or leaves a non-daemon thread is exit 2 saying what it did, and a plug-in that raises gives
its one-line error — through the real `submit --dry-run` (a fresh interpreter, its exit path as users see it),
with real modules in the submit directory."""

import time

import pytest

from hpc_train.config import NO_SITE, dump_yaml, resolve_job
from hpc_train.errors import ConfigError
from hpc_train.plugin_child import probe_in_child
from tests.cli_helpers import assert_refused, cli, tree

MODULES = {
    "exits.py": "import sys\nsys.exit(3)\n",
    "prints.py": "while True:\n    print('spam ' * 20)\n",
    "blocks.py": "import time\ntime.sleep(3600)\n",
    "threads.py": "import threading, time\nthreading.Thread(target=lambda: time.sleep(3600), name='poller').start()\n"
                  "def backbone(num_classes, in_channels):\n    pass\n",
    "raises.py": "def loss(counts):\n    raise ValueError('bad counts\\nsecond line')\n",
    "good.py": "def backbone(num_classes, in_channels):\n    pass\n",
}


@pytest.fixture
def plugins(tmp_path):
    (tmp_path / "hostileplug").mkdir()
    (tmp_path / "hostileplug" / "__init__.py").write_text("")
    for name, text in MODULES.items():
        (tmp_path / "hostileplug" / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("setting, said", [
    ("train.model.name=hostileplug.exits:x", "a plug-in called sys.exit(3)"),
    ("train.model.name=hostileplug.threads:backbone", "left non-daemon thread(s) running after import (poller)"),
    ("train.loss.name=hostileplug.raises:loss", "a plug-in raised ValueError: bad counts"),
])
def test_a_plugin_that_exits_leaves_a_thread_or_raises_is_exit_2_saying_so(plugins, stub_slurm, setting, said):
    # Before: sys.exit(3) at import ended the dry run with exit 3 and no word; the thread kept it from ever ending;
    # the raising loss was a traceback.
    before = tree(plugins)
    started = time.monotonic()
    result = cli("submit", "--dry-run", "--cluster", "local", "--set", setting, cwd=plugins, env=stub_slurm.env(),
                 timeout=60)
    assert time.monotonic() - started < 30
    assert_refused(result, said)
    assert "second line" not in result.stderr
    assert [p for p in tree(plugins) if "__pycache__" not in p] == [p for p in before if "__pycache__" not in p]


@pytest.mark.parametrize("module", ["prints", "blocks"])
def test_a_plugin_that_never_finishes_importing_is_ended_at_the_deadline(plugins, monkeypatch, module):
    monkeypatch.chdir(plugins)
    spec, _ = resolve_job(None, site=NO_SITE, sets=[f"train.model.name=hostileplug.{module}:x"])
    started = time.monotonic()
    with pytest.raises(ConfigError, match="did not finish within 3 s") as refused:
        probe_in_child(dump_yaml(spec), deadline_s=3)
    assert time.monotonic() - started < 10
    if module == "prints":
        assert "first: 'spam spam" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1


def test_a_good_plugin_is_probed_as_before(plugins, monkeypatch):
    monkeypatch.chdir(plugins)
    spec, _ = resolve_job(None, site=NO_SITE, sets=["train.model.name=hostileplug.good:backbone"])
    assert probe_in_child(dump_yaml(spec)) == [
        "plug-in model hostileplug.good:backbone(): imports, arguments match; returns a feature backbone: an "
        "nn.Module with a feature_dim attribute, or (module, feature_dim)"]
