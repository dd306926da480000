"""The local launcher's time-limit signal: every spelling of ``slurm.signal`` the ranks accept (``USR2``,
``SIGUSR2``, ``12``) reaches the ranks, ``signal_delay_s`` before the limit, as Slurm's ``--signal`` does."""

import signal
import subprocess
import sys

import pytest

from hpc_train.local import launcher

RANK = """
import signal, sys, time
def caught(signum, frame):
    print(signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR2, caught)
print("ready", flush=True)
time.sleep(30)
sys.exit(3)  # the signal never came
"""


@pytest.mark.parametrize("name", ["USR2", "SIGUSR2", "12"])
def test_the_time_limit_signal_reaches_the_ranks_whatever_its_spelling(tmp_path, name):
    launch = launcher.Launch(run_dir=str(tmp_path), run_id="1", world_size=2, visible_gpus=0, time_limit_s=3,
                             signal=name, signal_delay_s=2, env={})
    procs = [subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:  # the handler is in place before the launcher's clock starts
        assert proc.stdout.readline() == "ready\n"
    with open(tmp_path / "batch.log", "w+") as batch_log:
        code = launcher._supervise(procs, launch, batch_log)
        batch_log.seek(0)
        log = batch_log.read()
    assert code == 0, log
    assert [proc.stdout.read() for proc in procs] == ["SIGUSR2\n", "SIGUSR2\n"]
    assert f"2 s before the time limit: sending {signal.strsignal(signal.SIGUSR2)} ({name})" in log
