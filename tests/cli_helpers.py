"""Running the real console entry point in a fresh interpreter, as users do, and the bad-input promise
(exit 2, one or two lines on stderr, no traceback) every CLI test checks the same way."""

import subprocess
import sys


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
