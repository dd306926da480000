"""hpc_train.dist.setup() and leave(): a finished DDP rank leaves with its own exit code (issue 27, item 1).

What aborted (a core dump of a two-rank gloo run, torch 2.14): the gloo worker thread that ran DDP's last
all-reduce releases that work after the main thread went on; the work's thread-local state holds a Python
object (backward's ``contextvars`` context), so releasing it takes the GIL; when the main thread is already in
``Py_FinalizeEx`` the worker thread is ended inside a ``noexcept`` destructor -> ``std::terminate`` ->
SIGABRT, exit 134 ("terminate called without an active exception"), 1 run in 10-30. ``leave()`` skips the
finalisation (``os._exit`` after flushing), so nothing is released late; benchmarks/exit_aborts.py counts the
aborts over repeated runs (BENCHMARKS.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

DDP_SCRIPT = """
import atexit, sys
atexit.register(lambda: print("interpreter finalised", flush=True))  # leave() skips the interpreter's exit
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from hpc_train.dist import leave, setup
env = setup()
model = DDP(torch.nn.Linear(4, 4))
model(torch.ones(2, 4)).sum().backward()
print("rank", env.rank, "grad", model.module.bias.grad.tolist(), end="")  # no newline: leave() flushes
leave(int(sys.argv[1]))
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_ranks(tmp_path, code: int) -> list[tuple[int, str]]:
    (tmp_path / "user.py").write_text(DDP_SCRIPT)
    port = str(_port())
    ranks = [subprocess.Popen([sys.executable, "user.py", str(code)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              env={"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PATH": "/usr/bin:/bin",
                                   "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
             for r in range(2)]
    return [(rank.wait(timeout=120), rank.stdout.read()) for rank in ranks]


@pytest.mark.parametrize("code", [0, 75])
def test_a_ddp_rank_leaves_with_its_own_exit_code_and_its_output_flushed(tmp_path, code):
    for rank, (returncode, output) in enumerate(_two_ranks(tmp_path, code)):
        assert returncode == code, output
        assert output.startswith(f"rank {rank} grad [2.0, 2.0, 2.0, 2.0]"), output
        assert "interpreter finalised" not in output, output


def test_leave_is_torch_free(tmp_path):
    probe = "import sys; from hpc_train.dist import leave; print('torch' in sys.modules, end=''); leave(3)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "False")
