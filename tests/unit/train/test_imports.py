"""torch stays off the CLI's import path: the training package's light modules import without it."""

from __future__ import annotations

import subprocess

from .helpers import PYTHON, REPO, clean_env


def test_light_modules_import_without_torch(tmp_path):
    # A fresh interpreter: the test process itself has torch loaded by other tests.
    code = (
        "import sys\n"
        "import hpc_train.train, hpc_train.train.callable, hpc_train.rank.preempt, hpc_train.train.__main__\n"
        "from hpc_train.train.callable import TrainJob\n"
        "import pickle\n"
        "job = pickle.loads(pickle.dumps(TrainJob('name: x', '/tmp/run')))\n"  # what submitit does
        "heavy = sorted(m for m in ('torch', 'torchvision', 'numpy', 'sklearn') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=clean_env(tmp_path), capture_output=True, text=True,
                         check=True).stdout
    assert "HEAVY []" in out, out


def test_main_module_does_not_install_handlers_at_import(tmp_path):
    # The CLI imports hpc_train.train.__main__ to call main(argv); importing alone must change nothing.
    code = (
        "import signal\n"
        "before = signal.getsignal(signal.SIGUSR2)\n"
        "import hpc_train.train.__main__\n"
        "print('SAME', signal.getsignal(signal.SIGUSR2) is before)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=clean_env(tmp_path), capture_output=True, text=True,
                         check=True).stdout
    assert "SAME True" in out, out
