"""Running the real console entry point in a fresh interpreter, as users do, the bad-input promise (exit 2,
one or two lines on stderr, no traceback) every CLI test checks the same way, and what a run's state log says
about when its launch ran."""

import subprocess
import sys
import time
from pathlib import Path

from hpc_train.runs import rundir


def cli(*args, cwd=None, env=None, timeout=120):
    """``hpc-train ARGS`` in a fresh interpreter: exit codes and stderr as users see them."""
    return subprocess.run([sys.executable, "-m", "hpc_train.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def assert_refused(result, message):
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert 1 <= len(result.stderr.strip().splitlines()) <= 2, result.stderr


def tree(path):
    """Every path under ``path``, relative (what a refused command must leave as it was)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def launch_span(run_dir: Path) -> tuple[float, float]:
    """When the run's launch started and ended (its ``running`` and ``exit`` state lines), in seconds."""
    stamps = {e["event"]: time.mktime(time.strptime(e["time"][:19], "%Y-%m-%dT%H:%M:%S"))
              for e in rundir.read_events(run_dir)}
    return stamps["running"], stamps["exit"]


def script_values(script: str, expression: str) -> list[str]:
    """What bash makes of ``expression`` (``"$HT_JOB_YAML"``, ``"${HT_POINT_YAMLS[@]}"``) after a rendered script's
    preamble of job values: the words, as the script itself would read them."""
    preamble = script[script.index("readonly "):script.index("# Stop at the first failing")]
    printed = subprocess.run(["bash", "-c", f"{preamble}printf '%s\\0' {expression}"], capture_output=True, text=True,
                             check=True).stdout
    return printed.split("\0")[:-1]
