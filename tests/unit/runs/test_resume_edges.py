"""Continuing a run keeps its promises (issue 19, items 7 and 8): a run whose checkpoint files all fail to
load is refused (exit 2, the files named), never silently started over; a cancelled or preempted local run
continues to completion with `submit --resume RUN --wait`, as its own log says. Real local runs (one rank)."""

import functools
import json
from pathlib import Path

from hpc_train.config import NO_SITE, dump_yaml, resolve
from hpc_train.runs import rundir
from tests.cli_helpers import cli

run = functools.partial(cli, timeout=300)
ONE_QUICK_RANK = ["slurm.tasks_per_node=1", "train.epochs=1", "train.schedule.warmup_epochs=0",
                  "train.batch_size=64"]


def ended_run(work: Path, *events: dict, checkpoints: dict[str, bytes] | None = None) -> Path:
    """A local run directory as a submit and its launches leave it, ended with ``events``."""
    spec = resolve(None, site=NO_SITE, sets=ONE_QUICK_RANK).spec
    run_dir = work / "runs" / spec.name / "local-20260101-000000-1"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text(dump_yaml(spec))
    (run_dir / "config.json").write_text(json.dumps(spec.to_dict()))
    (run_dir / "run.json").write_text(json.dumps({"job_id": run_dir.name, "cluster": "local", "run_dir": str(run_dir),
                                                  "logs": rundir.own_logs(run_dir), "world_size": 1}))
    lines = [{"event": "queued", "writer": "submit"}, {"event": "running", "instance": "local:x.0", "writer": "launcher"},
             *events]
    (run_dir / "state.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    for name, data in (checkpoints or {}).items():
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        (run_dir / "checkpoints" / name).write_bytes(data)
    return run_dir


def state(work, run_dir):
    return json.loads(run("status", str(run_dir), "--json", cwd=work).stdout)


def test_unreadable_checkpoints_are_refused_naming_them_never_a_fresh_start(tmp_path):
    # Item 7: --resume started from scratch (exit 0), and the log repeated torch's advice to load the files
    # with weights_only=False (which would run the crafted one's code).
    marker = tmp_path / "RAN"
    crafted = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    run_dir = ended_run(tmp_path, {"event": "exit", "instance": "local:x.0", "exit_code": 75},
                        checkpoints={"ckpt-0000000014.pt": b"truncated by a full disk", "ckpt-0000000007.pt": crafted})
    result = run("submit", "--cluster", "local", "--resume", str(run_dir), "--wait", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "none of its 2 checkpoint(s) can be read (ckpt-0000000014.pt: " in result.stderr
    assert "ckpt-0000000007.pt: not a weights-only checkpoint (Trying to load unsupported GLOBAL os.system" in result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()
    logs = (run_dir / "logs" / "rank-0.log").read_text()
    assert "weights_only` set to `False`" not in logs and "weights_only=False" not in result.stderr + logs
    assert not (run_dir / rundir.METRICS).exists(), "it trained from scratch"
    shown = state(tmp_path, run_dir)
    assert shown["state"] == "failed" and "can be read" in shown["reason"] and shown["exit_code"] == 2


def test_a_cancelled_local_run_resumes_to_completion(tmp_path):
    # Item 8: --resume of a cancelled (or preempted) local run exited 1 at once saying "cancelled", and the
    # local launcher did not start it.
    run_dir = ended_run(tmp_path, {"event": "cancelled", "writer": "hpc-train cancel", "reason": "cancelled by the user"},
                        {"event": "exit", "instance": "local:x.0", "exit_code": 143})
    assert state(tmp_path, run_dir)["state"] == "cancelled"
    result = run("submit", "--cluster", "local", "--resume", str(run_dir), "--wait", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(" completed\n")
    shown = state(tmp_path, run_dir)
    assert shown["state"] == "completed" and shown["restarts"] == 1
    assert json.loads((run_dir / rundir.METRICS).read_text().splitlines()[-1])["epoch"] == 1
