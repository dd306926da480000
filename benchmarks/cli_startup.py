"""1. CLI start-up: ``hpc-train render --nodes 4 --gpus 8`` against ``python -c "import torch"`` (what a
launcher script that imports torch pays before it does anything) and ``python -c pass`` (the floor:
the interpreter alone). Each is a fresh process, timed wall-clock from spawn to exit."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .common import PYTHON, child_env, interleave, spread, timer

CLI = str(Path(PYTHON).with_name("hpc-train"))


def commands() -> dict[str, list[str]]:
    return {
        "hpc_train_render": [CLI, "render", "--nodes", "4", "--gpus", "8"],
        "python_import_torch": [PYTHON, "-c", "import torch"],
        "python_import_torch_submitit": [PYTHON, "-c", "import torch, submitit"],
        "python_pass": [PYTHON, "-c", "pass"],
    }


def run(*, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site.yaml"
        site.write_text("{}\n")  # built-in defaults: no site file of this machine changes the work
        env = child_env(HPC_TRAIN_SITE=str(site))
        # Python may cache our modules' bytecode, as in any install (pip compiles a wheel's at install; torch's and
        # jinja2's here were): a shell with PYTHONDONTWRITEBYTECODE set would time hpc-train compiling every module of
        # its own from source on every call against a torch that never does (0.089 vs 0.068 of it, 2026-12-03).
        env.pop("PYTHONDONTWRITEBYTECODE", None)

        def spawn(argv: list[str]):
            def once() -> float:
                elapsed = timer()
                subprocess.run(argv, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
                return elapsed()
            return once

        cmds = commands()
        for argv in cmds.values():  # warm the page cache once; not timed
            spawn(argv)()
        walls = interleave({name: spawn(argv) for name, argv in cmds.items()}, rounds)
    stats = {f"{name}_wall_s": spread(values) for name, values in walls.items()}
    med = {name: stats[f"{name}_wall_s"]["median"] for name in walls}
    return {
        "commands": {name: " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))
                     for name, argv in commands().items()},
        "rounds": rounds, **stats,
        "render_vs_torch_import": med["hpc_train_render"] / med["python_import_torch"],
        "render_vs_python_pass": med["hpc_train_render"] / med["python_pass"],
        "render_minus_python_pass_s": med["hpc_train_render"] - med["python_pass"],
    }
