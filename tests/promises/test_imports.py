"""The CLI starts without torch (and without submitit): login nodes need neither."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["hpc_train.cli", "hpc_train.config", "hpc_train.render", "hpc_train.dist",
                                    "hpc_train.slurm.queue", "hpc_train.command", "hpc_train.config.plugins",
                                    "hpc_train.plugin_loading", "hpc_train.plugin_probe",
                                    "hpc_train.runs.report", "hpc_train.local.launcher", "hpc_train.local"])
def test_no_heavy_imports(module):
    code = (f"import sys, {module}; heavy = [m for m in ('torch', 'torchvision', 'numpy', 'submitit') "
            "if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} imported {out}"


def test_render_command_does_not_import_torch():
    code = ("import sys; from click.testing import CliRunner; from hpc_train.cli import cli; "
            "r = CliRunner().invoke(cli, ['render', '--nodes', '4', '--gpus', '8']); "
            "assert r.exit_code == 0, r.output; print('torch' in sys.modules, 'submitit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False False"
