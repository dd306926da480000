"""The watchdog's requeue sequence (requeuehold, update ExcNodeList, release) under the SIGTERM that Slurm sends to
every process of the batch step right after ``requeuehold`` (issue 26): the kill is reproduced with real processes
and a real signal, at the moment that lost the call on the harness.

What is real: the watchdog's own code and its SIGTERM handler, in a process of its own; the scontrol processes it
starts; the signal, sent by a separate process to every process of the "step" (the watchdog's process tree, as
``proctrack/linuxproc`` finds it, the harness's; ``pgid`` mode: its process group, as ``proctrack/pgid``). What is
a stand-in: scontrol itself, a small program keeping the job's state in files (held, ExcNodeList), which cannot
show slurmctld's timing; the real sequence runs on the harness in tests/real_cluster/test_requeue_race.py and,
repeated, in benchmarks/requeue_race.py. ``proctrack/cgroup`` (most sites) signals every process of the step's
cgroup: the same as the tree here, for a process that ignores SIGTERM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpc_train.runs import bad_nodes

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]

SCONTROL = textwrap.dedent('''\
    #!{python} -IS
    # A stand-in scontrol: the job's state in $STATE_DIR; a call that changes it says so first (busy-<verb>) and
    # takes 0.3 s, the window in which the step's SIGTERM arrives on a real cluster.
    import json, os, subprocess, sys, time
    state_dir = os.environ["STATE_DIR"]
    path = os.path.join(state_dir, "job.json")
    job = json.load(open(path))
    args = sys.argv[1:]
    def save():
        json.dump(job, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
    if args[:2] == ["show", "config"]:
        print("KillWait                = 5 sec")
    elif args[:2] == ["show", "job"]:
        reason = "job_requeued_in_held_state" if job["held"] else "BeginTime"
        print(f"JobId={{args[2]}} JobName=race\\n   JobState={{job['state']}} Reason={{reason}} Dependency=(null)\\n"
              f"   ReqNodeList=(null) ExcNodeList={{job['exc'] or '(null)'}}")
    elif args[0] == "requeuehold":
        job.update(held=True, state="PENDING"); save()
        # slurmd's part: SIGTERM to the step's processes while the caller's next call runs
        log = open(os.path.join(state_dir, "slurmd.log"), "w")  # not the caller's pipes: it would wait for them
        subprocess.Popen([sys.executable, os.path.join(state_dir, "slurmd.py"), str(os.getppid())],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    elif args[0] == "update" and os.environ.get("REFUSE_UPDATE"):
        print("scontrol: error: Job is no longer pending execution", file=sys.stderr)
        sys.exit(1)
    elif args[0] in ("update", "release"):
        open(os.path.join(state_dir, "busy-" + args[0]), "w").close()
        time.sleep(0.3)
        if args[0] == "update":
            job["exc"] = args[2].split("=", 1)[1]
        else:
            job["held"] = False
        save()
    open(os.path.join(state_dir, "done-" + args[0]), "a").write("x")
''')

SLURMD = textwrap.dedent('''\
    # The step's SIGTERM: when the watched call has started, to every process of the step.
    import os, signal, sys, time
    state_dir, hit, mode, root = {state_dir!r}, {hit!r}, {mode!r}, int(sys.argv[1])  # root: the watchdog
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(state_dir, "busy-" + hit)) and time.monotonic() < deadline:
        time.sleep(0.005)
    if mode == "pgid":
        os.killpg(root, signal.SIGTERM)
    else:  # proctrack/linuxproc: the tree under the step's first process
        parents = {{}}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = open(f"/proc/{{entry}}/stat").read()
                except OSError:
                    continue
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        tree, grown = {{root}}, True
        while grown:
            more = {{pid for pid, parent in parents.items() if parent in tree}} - tree
            tree |= more
            grown = bool(more)
        for pid in tree - {{os.getpid()}}:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    open(os.path.join(state_dir, "signalled"), "w").close()
''')

WATCHDOG = textwrap.dedent('''\
    # The watchdog at the moment it requeues: its own SIGTERM handler, acting (hpc_train/slurm/watchdog.py).
    import signal, sys
    from pathlib import Path
    from hpc_train.slurm import watchdog
    signal.signal(signal.SIGTERM, watchdog._on_term)
    watchdog._acting = True
    result = watchdog.requeue_excluding(Path(sys.argv[1]), "20")
    print(result if isinstance(result, tuple) else result.message)
''')


@pytest.mark.parametrize("mode", ["tree", "pgid"])
@pytest.mark.parametrize("hit", ["update", "release"])
def test_the_step_sigterm_after_requeuehold_leaves_the_job_released_and_the_node_excluded(tmp_path, hit, mode):
    state_dir, run_dir, bin_dir = tmp_path / "slurm", tmp_path / "run", tmp_path / "bin"
    for folder in (state_dir, run_dir, bin_dir):
        folder.mkdir()
    (state_dir / "job.json").write_text(json.dumps({"state": "RUNNING", "held": False, "exc": ""}))
    bad_nodes.add(run_dir, "gpu02", "hung", job_id="20", restart=0)
    (state_dir / "slurmd.py").write_text(SLURMD.format(state_dir=str(state_dir), hit=hit, mode=mode))
    (bin_dir / "scontrol").write_text(SCONTROL.format(python=sys.executable))
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE_DIR": str(state_dir),
           "PYTHONPATH": str(REPO)}
    watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(run_dir)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = watchdog.communicate(timeout=45)
    deadline = time.monotonic() + 20
    while not (state_dir / "signalled").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (state_dir / "signalled").exists(), "the step's SIGTERM was not sent"
    job = json.loads((state_dir / "job.json").read_text())
    assert watchdog.returncode == 0, err
    assert not job["held"], f"the job was left held: {out.strip()}"
    assert job["exc"] == "gpu02", f"ExcNodeList not set: {out.strip()}"
    assert out.strip() == "requeued job 20, excluding gpu02", out


def test_a_node_that_cannot_be_excluded_still_leaves_the_job_released_and_says_why(tmp_path):
    from hpc_train.runs import rundir
    from hpc_train.runs.scheduler_job import SchedulerJob
    from hpc_train.runs.status import reconcile
    from hpc_train.slurm import requeue, watchdog

    state_dir, run_dir, bin_dir = tmp_path / "slurm", tmp_path / "run", tmp_path / "bin"
    for folder in (state_dir, run_dir, bin_dir):
        folder.mkdir()
    (state_dir / "job.json").write_text(json.dumps({"state": "RUNNING", "held": False, "exc": ""}))
    (state_dir / "slurmd.py").write_text("")  # no signal this time
    bad_nodes.add(run_dir, "gpu02", "hung", job_id="20", restart=0)
    (bin_dir / "scontrol").write_text(SCONTROL.format(python=sys.executable))
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE_DIR": str(state_dir), "REFUSE_UPDATE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        outcome = requeue.requeue_excluding("20", ["gpu02"], kill_wait=3)
        watchdog._note_problem(run_dir, "slurm:20.0", 0, "hung: rank 1 on gpu02", outcome)
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    job = json.loads((state_dir / "job.json").read_text())
    assert not job["held"] and job["exc"] == ""
    assert outcome.requeued and not outcome.held and outcome.excluded == ()
    assert outcome.message == ("requeued job 20 (ExcNodeList not updated, gpu02 may be used again: "
                               "scontrol: error: Job is no longer pending execution)")
    waiting = SchedulerJob("20", "PENDING", "requeued", scheduler="Slurm", reason="BeginTime")
    state, reason = reconcile(rundir.read_state(run_dir), waiting)
    assert state == "requeued" and reason == ("BeginTime; ExcNodeList not updated, gpu02 may be used again: "
                                              "scontrol: error: Job is no longer pending execution")
