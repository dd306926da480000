"""Ranks are started with no Python code run in the forked child (issue 28: ``preexec_fn`` while the launcher's
threads run is unsafe, Python's documentation says), and still get their parent-death signal and a process group
of their own (:mod:`hpc_train.local.rank_start`). Real processes: the launcher's own ``_start_ranks`` in a child
interpreter with a thread running, and the started rank reporting what the kernel says of it."""

import json
import os
import signal
import subprocess
import sys
import textwrap

# The launcher's process: a thread runs while it starts two ranks. A fork hook (run by CPython in a forked child
# only when Python code runs there, as with preexec_fn) leaves a mark; each rank records what the kernel says of it.
LAUNCHER = textwrap.dedent("""
    import json, os, sys, threading, time
    from pathlib import Path
    from hpc_train.local import launcher
    run_dir = Path(sys.argv[1])
    os.register_at_fork(after_in_child=lambda: os.close(os.open(run_dir / "python-ran-in-forked-child",
                                                                os.O_CREAT | os.O_WRONLY)))
    busy = threading.Thread(target=time.sleep, args=(5,), daemon=True)
    busy.start()
    launch = launcher.Launch(run_dir=str(run_dir), run_id="1", world_size=2, visible_gpus=0, time_limit_s=0,
                             signal="USR2", signal_delay_s=0, env={}, entry="probe_rank")
    (run_dir / "logs").mkdir()
    procs = launcher._start_ranks(launch, sys.executable, str(run_dir), 29500, "local:1.0")
    print(json.dumps({"launcher": os.getpid(), "pids": [p.pid for p in procs], "codes": [p.wait() for p in procs]}))
""")

PROBE = textwrap.dedent("""
    import ctypes, json, os, signal
    got = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(got), 0, 0, 0)  # PR_GET_PDEATHSIG
    with open(f"probe-{os.environ['RANK']}.json", "w") as out:
        json.dump({"pid": os.getpid(), "pdeathsig": got.value, "leads_group": os.getpgrp() == os.getpid(),
                   "parent": os.getppid()}, out)
""")


def test_ranks_start_without_python_in_the_forked_child_and_keep_their_parent_death_signal(tmp_path):
    (tmp_path / "probe_rank.py").write_text(PROBE)
    result = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp_path)], capture_output=True, text=True,
                            timeout=120, cwd=os.getcwd())
    assert result.returncode == 0, result.stderr
    started = json.loads(result.stdout)
    assert started["codes"] == [0, 0], [(tmp_path / f"logs/rank-{r}.log").read_text() for r in range(2)]
    assert not (tmp_path / "python-ran-in-forked-child").exists()
    probes = [json.loads((tmp_path / f"probe-{rank}.json").read_text()) for rank in range(2)]
    assert [p["pid"] for p in probes] == started["pids"]  # the rank is the process the launcher started (exec, same pid)
    assert all(p["pdeathsig"] == signal.SIGKILL and p["leads_group"] and p["parent"] == started["launcher"]
               for p in probes), probes


def test_a_rank_whose_launcher_died_before_it_started_leaves_at_once(tmp_path):
    # The race check after the signal is set: the launcher named (pid 1 here) is not the parent: the rank never runs.
    result = subprocess.run([sys.executable, "-m", "hpc_train.local.rank_start", "1", "--", sys.executable, "-c",
                             "open('ran', 'w')"], cwd=tmp_path, timeout=60)
    assert result.returncode == 128 + signal.SIGKILL
    assert not (tmp_path / "ran").exists()


def test_a_rank_program_that_cannot_start_is_127_in_one_line(tmp_path):
    # Where Popen raised in the launcher before, the shim says it as a shell does (127: not found).
    driver = ("import os, subprocess, sys; r = subprocess.run([sys.executable, '-m', 'hpc_train.local.rank_start', "
              "str(os.getpid()), '--', 'no-such-program-here'], capture_output=True, text=True); "
              "print(r.returncode); print(r.stderr, end='')")
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    code, *said = result.stdout.splitlines()
    assert code == "127" and said == ["hpc-train: cannot start the rank: no-such-program-here: No such file or "
                                      "directory"], result.stdout + result.stderr
