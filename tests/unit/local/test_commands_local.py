"""Your own command under hpc-train, locally (`--cluster local`): every rank gets the mapping and the argv
exactly as typed, a failing rank fails the run with its rank and host named, the preemption contract
(checkpoint on the signal, exit 75, launched again, resumed); and `--pack 2` runs sweep points together with
the same per-run metrics as run one after another. The same on the Slurm cluster: tests/real_cluster/test_commands.py."""

import functools
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.cli_helpers import cli, launch_span

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
HOSTILE = ["$(touch pwned)", "010", "on", "a b", "it's", "--set", ""]


run = functools.partial(cli, timeout=300)


def only_run_dir(cwd: Path, name: str) -> Path:
    (run_dir,) = (cwd / "runs" / name).glob("local-*")
    return run_dir


def test_ranks_get_the_mapping_and_argv_as_typed_and_a_failing_rank_is_named(tmp_path):
    started = time.monotonic()
    result = run("submit", "--cluster", "local", "--tasks-per-node", "3", "--wait", "--",
                 sys.executable, str(SCRIPTS / "show_rank.py"), "2", *HOSTILE, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started < 20  # the other ranks (sleeping 30 s) were ended when rank 2 failed
    host = socket.gethostname()
    assert f"failed: rank 2 on {host}: Exited with exit code 7" in result.stderr  # the launcher names it
    run_dir = only_run_dir(tmp_path, "show_rank")
    seen = [json.loads((run_dir / f"seen-{rank}.json").read_text()) for rank in range(3)]
    assert [s["argv"] for s in seen] == [["2", *HOSTILE]] * 3  # no shell, no YAML reading
    assert not (tmp_path / "pwned").exists()
    env = [s["env"] for s in seen]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in env] == \
        [(str(r), str(r), "3", "3") for r in range(3)]
    assert {e["MASTER_ADDR"] for e in env} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in env}) == 1
    assert {(e["HPC_TRAIN_RESTART"], e["HPC_TRAIN_SIGNAL"], e["HPC_TRAIN_EXIT_REQUEUE"]) for e in env} == {("0", "USR2", "75")}
    status = json.loads(run("status", "show_rank", "--json", cwd=tmp_path).stdout)
    assert status["state"] == "failed" and status["exit_code"] == 7
    assert status["reason"] == f"rank 2 on {host}: Exited with exit code 7"
    assert json.loads((run_dir / "ranks" / "rank-1.json").read_text())["command"][2:] == ["2", *HOSTILE]


def test_checkpoint_on_the_signal_is_launched_again_and_resumes(tmp_path):
    # Time limit 1 min, the signal 55 s before it: it comes 5 s into each launch; 80 steps take 8 s (the resumed
    # launch runs what is left at once, so it ends before the signal comes again, however busy the machine).
    result = run("submit", "--cluster", "local", "--tasks-per-node", "2", "--time", "1",
                 "--set", "slurm.signal_delay_s=55", "--wait", "--", sys.executable,
                 str(SCRIPTS / "checkpoint_on_signal.py"), "80", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run_dir(tmp_path, "checkpoint_on_signal")
    done = [json.loads((run_dir / f"done-{rank}.json").read_text()) for rank in range(2)]
    assert all(d["step"] == 80 and d["restart"] == 1 and 10 < d["resumed_from"] < 80 for d in done), done
    assert sorted(p.name for p in run_dir.glob("started-*")) == ["started-0-0", "started-0-1", "started-1-0",
                                                                  "started-1-1"]
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["restart"] == 1 and launch["exit_requeue"] == 75 and launch["signal"] == "USR2"
    status = json.loads(run("status", "checkpoint_on_signal", "--json", cwd=tmp_path).stdout)
    assert status["state"] == "completed" and status["restarts"] == 1
    events = [json.loads(line)["event"] for line in (run_dir / "state.jsonl").read_text().splitlines()]
    assert events == ["queued", "running", "ranks", "requeued", "running", "ranks", "exit"]  # ranks: their pids


def test_a_command_job_refuses_what_it_cannot_use(tmp_path):
    for args, words in ((["--"], "nothing after '--'"),
                        (["--sweep", "train.seed=0,1", "--", "true"], "submit one job per variant"),
                        (["--pack", "2", "--tasks-per-node", "1", "--", "true"], "a command runs alone")):
        result = run("submit", "--cluster", "local", *args, cwd=tmp_path)
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) <= 2 and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def _metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"record": ' not in line]
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


def test_pack_2_gives_the_metrics_of_the_same_points_run_alone(tmp_path):
    points = ["--sweep", "train.seed=3,4", "--tasks-per-node", "1", "--set", "train.batch_size=32",
              "--set", "train.epochs=2", "--set", "train.schedule.warmup_epochs=0", "--set", "train.num_threads=1"]
    alone = json.loads(run("submit", "--cluster", "local", *points, "--name", "alone", "--wait", "--json",
                           cwd=tmp_path).stdout.splitlines()[0])
    packed = json.loads(run("submit", "--cluster", "local", *points, "--name", "packed", "--pack", "2", "--wait",
                            "--json", cwd=tmp_path).stdout.splitlines()[0])
    assert "2 at a time" in packed["note"]
    runs = {name: [tmp_path / "runs" / name / task for task in out["tasks"]]
            for name, out in (("alone", alone), ("packed", packed))}
    for one, together in zip(runs["alone"], runs["packed"]):
        assert _metrics(one) == _metrics(together) and len(_metrics(one)) == 2
    seeds = [json.loads((d / "config.json").read_text())["train"]["seed"] for d in runs["packed"]]
    assert seeds == [3, 4]
    # Together: each point started before the other ended, each with its own rendezvous port.
    spans = [launch_span(run_dir) for run_dir in runs["packed"]]
    assert spans[0][0] <= spans[1][1] and spans[1][0] <= spans[0][1]
    ports = {json.loads((d / "ranks" / "rank-0.json").read_text())["master_port"] for d in runs["packed"]}
    assert len(ports) == 2


def test_report_and_env_bad_input_is_exit_2(tmp_path):
    for args, words in ((["report", "no-such-job"], "no runs for 'no-such-job'"),
                        (["report"], "Missing argument"),
                        (["env"], None)):
        result = run(*args, cwd=tmp_path)
        if words is None:  # outside a job: one process, rank 0 of 1
            assert result.returncode == 0 and result.stdout.startswith("RANK=0 LOCAL_RANK=0 WORLD_SIZE=1"), result
            continue
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
    bad = cli("env", cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "RANK": "3", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                        "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    assert bad.returncode == 2 and "rank 3 is outside world size 2" in bad.stderr and "Traceback" not in bad.stderr


def test_snapshot_records_the_code_that_runs(tmp_path):
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "train.py").write_text("print('v1')\n")
    git("add", "train.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    (tmp_path / "train.py").write_text("print('v2, not committed')\n")
    (tmp_path / "notes.txt").write_text("untracked\n")
    result = run("submit", "--cluster", "local", "--tasks-per-node", "1", "--snapshot", "--wait", "--",
                 sys.executable, "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path, "train")
    code = json.loads((run_dir / "code.json").read_text())
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert code["git_sha"] == head.strip() and code["dirty"] and "notes.txt" in code["untracked"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["git_sha"] == head.strip() and record["submit_dir"] == str(tmp_path)
    assert "+print('v2, not committed')" in (run_dir / "code.diff").read_text()
    assert "v2, not committed" in (run_dir / "logs" / "rank-0.log").read_text()
