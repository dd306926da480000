"""`--cluster local`: the embedded default job as 2 real DDP processes (submitit's local executor, gloo),
followed by --wait, then found again by status and logs. The `make demo` path, shortened."""

import json
import subprocess
import sys


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hpc_train.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_local_submit_wait_status_logs(tmp_path):
    result = run("submit", "--cluster", "local", "--wait", "--set", "train.epochs=3", "--set",
                 "train.schedule.warmup_epochs=0", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # --wait streams rank 0 and ends with the many/medium/few table.
    assert "many >100 / medium / few <20" in result.stdout and "finished successfully" in result.stdout
    run_dirs = list((tmp_path / "runs" / "digits-lt-demo").glob("local-*"))
    assert len(run_dirs) == 1
    run_dir = run_dirs[0]
    ranks = sorted(json.loads(p.read_text())["rank"] for p in (run_dir / "ranks").glob("rank-*.json"))
    assert ranks == [0, 1]
    assert [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    status = json.loads(run("status", "--json", cwd=tmp_path).stdout)
    assert [s["state"] for s in status] == ["COMPLETED"] and status[0]["cluster"] == "local"
    logs = run("logs", "digits-lt-demo", cwd=tmp_path).stdout
    assert "[rank 0] " in logs and "[rank 1] " in logs
