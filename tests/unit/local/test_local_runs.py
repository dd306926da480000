"""`--cluster local`: the embedded default does what Slurm does — real DDP processes (gloo) started by the
local launcher, the run directory's layout and states, sweeps, --resume and --chain one after another,
cancel, slurm.env applied, and a rank's configuration or data error as exit 2 with its reason."""

import functools
import json
import time
from pathlib import Path

from tests.cli_helpers import cli

QUICK = ["--set", "train.schedule.warmup_epochs=0"]


run = functools.partial(cli, timeout=600)


def status(cwd, *args):
    return json.loads(run("status", *args, "--json", cwd=cwd).stdout)


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
            if '"record": ' not in line]  # evaluations, not the ranks' compute times


def test_local_submit_wait_status_logs(tmp_path):
    result = run("submit", "--cluster", "local", "--wait", "--set", "train.epochs=3", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # --wait streams rank 0 and ends with the many/medium/few table.
    assert "many >100 / medium / few <20" in result.stdout and result.stdout.endswith(" completed\n")
    (run_dir,) = (tmp_path / "runs" / "digits-lt-demo").glob("local-*")
    # The same layout as a Slurm run: the resolved job, the record, the state log, batch and rank logs.
    for name in ("job.yaml", "config.json", "run.json", "state.jsonl", "logs/batch.log", "logs/rank-0.log",
                 "logs/rank-1.log"):
        assert (run_dir / name).is_file(), name
    ranks = sorted(json.loads(p.read_text())["rank"] for p in (run_dir / "ranks").glob("rank-*.json"))
    assert ranks == [0, 1]
    assert {json.loads(p.read_text())["source"] for p in (run_dir / "ranks").glob("rank-*.json")} == {"local"}
    assert [m["epoch"] for m in metrics(run_dir)] == [1, 2, 3]
    listed = status(tmp_path)
    assert [(s["state"], s["cluster"], s["exit_code"]) for s in listed] == [("completed", "local", 0)]
    logs = run("logs", "digits-lt-demo", cwd=tmp_path).stdout
    assert "[rank 0] " in logs and "[batch] " in logs  # rank 1 logs only warnings: its file is empty


def test_local_packed_sweep_names_every_point_then_resume_and_chain_run_one_after_another(tmp_path):
    # A packed sweep (two points at a time) is named as a whole, as a Slurm array is, and when it is done every
    # point is named: it printed its point 0 alone (issue 28, item 8).
    one_rank = ["--tasks-per-node", "1", "--set", "train.batch_size=64", "--set", "train.epochs=1", *QUICK]
    result = run("submit", "--cluster", "local", "--sweep", "train.seed=0,1", "--set", "slurm.pack=2", *one_rank,
                 "--wait", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tasks = sorted(p.name for p in (tmp_path / "runs/digits-lt-demo").glob("local-*"))
    sweep = tasks[0].rsplit("_", 1)[0]
    assert tasks == [f"{sweep}_0", f"{sweep}_1"] and "2 local runs, 2 at a time" in result.stderr
    assert result.stdout.splitlines()[0].startswith(f"submitted digits-lt-demo/{sweep}_* (job {sweep}, local)")
    assert result.stdout.splitlines()[-1] == (f"digits-lt-demo/{sweep}_* completed: all 2 points "
                                              f"({sweep}_0, {sweep}_1)"), result.stdout
    shown = run("status", f"digits-lt-demo/{sweep}_*", cwd=tmp_path).stdout
    assert f"2 point(s): 2 completed; completed: {sweep}_0, {sweep}_1" in shown, shown
    runs = {s["job_id"]: s for s in status(tmp_path)}
    assert [runs[t]["state"] for t in tasks] == ["completed", "completed"]
    seeds = [json.loads((tmp_path / "runs/digits-lt-demo" / t / "config.json").read_text())["train"]["seed"] for t in tasks]
    assert seeds == [0, 1]
    first = tmp_path / "runs/digits-lt-demo" / tasks[0]
    steps = metrics(first)[-1]["global_step"]
    # Continue the first point for two more epochs; the chain's second launch finds it done.
    result = run("submit", "--cluster", "local", "--resume", f"digits-lt-demo/{tasks[0]}", "--chain", "2",
                 "--set", "train.epochs=3", "--wait", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [m["epoch"] for m in metrics(first)] == [1, 2, 3] and metrics(first)[-1]["global_step"] == 3 * steps
    final = status(tmp_path, tasks[0])
    assert final["state"] == "completed" and final["restarts"] == 2  # three launches of one run


def test_local_rank_error_is_exit_2_with_its_reason_and_env_is_applied(tmp_path):
    result = run("submit", "--cluster", "local", "--wait", "--set", "train.data.name=cifar10-lt",
                 "--set", "train.data.root=/nonexistent", "--set", "slurm.env.CUDA_VISIBLE_DEVICES=010",
                 "--set", "slurm.modules=[cuda/12.4]", "--set", "slurm.venv=/shared/venv", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert "slurm.modules, slurm.venv ignored" in lines[0] and "slurm.env applied" in lines[0]
    error = lines[1:]
    assert 1 <= len(error) <= 2 and "missing data_batch_1" in error[0] and "Traceback" not in result.stderr
    (run_dir,) = (tmp_path / "runs" / "digits-lt-demo").glob("local-*")
    shown = status(tmp_path)[0]
    assert shown["state"] == "failed" and "missing data_batch_1" in shown["reason"] and shown["exit_code"] == 2
    # slurm.env reaches the ranks, as written (010 stays text).
    assert json.loads((run_dir / "ranks" / "rank-0.json").read_text())["CUDA_VISIBLE_DEVICES"] == "010"


def test_local_cancel_ends_the_ranks_at_once(tmp_path):
    out = json.loads(run("submit", "--cluster", "local", "--set", "train.epochs=500", *QUICK, "--json",
                         cwd=tmp_path).stdout)
    run_dir = Path(out["run_dir"])
    deadline = time.monotonic() + 120
    while not (run_dir / "ranks" / "rank-1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status(tmp_path, out["run_name"])["state"] == "running"
    assert "cancelled digits-lt-demo/" in run("cancel", out["run_name"], cwd=tmp_path).stdout
    assert status(tmp_path, out["run_name"])["state"] == "cancelled"  # at once, not after the ranks are gone
    pid = json.loads((run_dir / "run.json").read_text())["launcher_pid"]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "the local launcher did not end"
    shown = status(tmp_path, out["run_name"])
    assert shown["state"] == "cancelled" and "hint" not in shown
    assert "already ended (cancelled)" in run("cancel", out["run_name"], cwd=tmp_path).stdout
