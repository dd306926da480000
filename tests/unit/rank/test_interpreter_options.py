"""A ``train`` run alone starts itself again (``hpc-train train`` becomes ``python -m hpc_train.train``, which execs
itself with its run directory in its environment): the interpreter's own options (``-X dev``, ``-W``, ``-O``) must
survive both steps. Before, the new process ran without them. Real processes: the re-exec'd interpreter writes its
own ``sys.flags``/``sys.warnoptions`` from a ``sitecustomize`` on PYTHONPATH (it sees the run directory in its
environment, so only the process after the re-exec writes them) and leaves before torch is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.rank.interpreter import interpreter_options

RECORDER = """import json, os, sys
if os.environ.get("HPC_TRAIN_RUN_DIR"):  # the process after the run directory was carried in: say its flags, leave
    with open(os.environ["FLAGS_FILE"], "w") as handle:
        json.dump({"dev_mode": sys.flags.dev_mode, "optimize": sys.flags.optimize, "warnoptions": sys.warnoptions,
                   "orig_argv": sys.orig_argv}, handle)
    os._exit(0)
"""
OPTIONS = ["-X", "dev", "-W", "error::BytesWarning", "-O"]  # a filter that can be seen but never fires here
HPC_TRAIN = shutil.which("hpc-train", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("program", [
    ["-m", "hpc_train.train"],          # python -m hpc_train.train JOB
    ["-m", "hpc_train.cli", "train"],   # hpc-train train JOB, through python -m
    [HPC_TRAIN, "train"],               # the console script, run by an interpreter given options
], ids=["module", "cli-module", "console-script"])
def test_a_train_run_alone_keeps_the_interpreters_options_when_it_starts_itself_again(tmp_path, program,
                                                                                      isolated_launch_env):
    assert HPC_TRAIN, "the hpc-train console script is not installed beside this interpreter (make venv)"
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(RECORDER)
    unset = ("PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONOPTIMIZE")  # the options come from the command line only
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "hook"), *filter(None, [env.get("PYTHONPATH")])]),
               FLAGS_FILE=str(tmp_path / "flags.json"))
    done = subprocess.run([sys.executable, *OPTIONS, *program, "digits_lt_demo", "--set", "slurm.tasks_per_node=1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    flags = json.loads((tmp_path / "flags.json").read_text())
    assert flags["dev_mode"] and flags["optimize"] == 1, flags
    assert "error::BytesWarning" in flags["warnoptions"], flags
    assert flags["orig_argv"][1:8] == [*OPTIONS, "-m", "hpc_train.train"], flags


@pytest.mark.parametrize("orig_argv,argv,options", [
    (["py", "-Xdev", "-uBm", "hpc_train.train", "job"], ["/m.py", "job"], ["-Xdev", "-uB"]),
    (["py", "-OOmhpc_train.cli", "train"], ["/m.py", "train"], ["-OO"]),
    (["py", "/venv/bin/hpc-train", "train", "-X", "j"], ["/venv/bin/hpc-train", "train", "-X", "j"], []),
    (["py", "--check-hash-based-pycs", "never", "-E", "-m", "m"], ["/m.py"], ["--check-hash-based-pycs", "never", "-E"]),
    (["py", "-W", "ignore", "-uc", "code", "a"], ["-c", "a"], ["-W", "ignore", "-u"]),
])
def test_the_options_are_read_as_python_reads_them(orig_argv, argv, options):
    assert interpreter_options(orig_argv, argv) == options
