"""examples/ on the harness cluster (2 nodes, CPUs, gloo): the plain DDP, accelerate and HF Trainer examples under
srun, one rank per node,
`python` after `--` being the job's interpreter, preempted by hpc-train's signal, requeued by the batch script,
resumed from HPC_TRAIN_CHECKPOINT_DIR and completed (issue 27, item 3). The local counterpart:
tests/examples/test_examples_local.py.

USR2 goes out once both ranks of the first launch have trained a step (their heartbeats, restart 0), and the first
launch steps slowly (tests/examples/first_launch_slow.py: minutes for the whole launch), so neither a starved test
nor a slow ``scancel`` delivery can meet a first launch that already completed unpreempted (with the examples' own
pace it ended 4-15 s after the ranks began stepping); the resumed launch keeps the quick pace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster import harness
from tests.real_cluster.test_lifecycle import _restart_count, hpc, wait_for, wait_state

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FIRST_LAUNCH_SLOW = Path(__file__).resolve().parents[1] / "examples" / "first_launch_slow.py"
FIRST_LAUNCH_STEP_S = "1"


def _slow_first_launch(example: str, *args: str) -> list[str]:
    """The command after ``--``: ``python EXAMPLE ARGS`` (the job's interpreter), its first launch one step a second."""
    return ["python", str(FIRST_LAUNCH_SLOW), FIRST_LAUNCH_STEP_S, str(EXAMPLES / example), *args]


def _stepping(run_dir: Path) -> bool:
    """Both ranks of the first launch have trained at least one step (their progress heartbeat, restart 0)."""
    records = []
    for rank in range(2):
        try:
            records.append(json.loads((run_dir / "ranks" / f"rank-{rank}.progress").read_text()))
        except (OSError, ValueError):
            return False
    return all(r["restart"] == 0 and r["step"] >= 1 for r in records)


def test_plain_ddp_example_is_preempted_requeued_resumed_and_completed(slurm_cluster, tmp_path):
    out = json.loads(hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "1", "--name", "plain", "--json", "--",
                         *_slow_first_launch("plain_ddp.py", "--steps", "300", "--step-s", "0.05"),
                         cwd=tmp_path).stdout.splitlines()[-1])
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    wait_for(lambda: _stepping(run_dir), 180, "both ranks stepping")
    harness.run_slurm(["scancel", "--signal=USR2", job_id], env=slurm_cluster.env)
    assert wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=300) == "COMPLETED"
    assert _restart_count(job_id, slurm_cluster.env) == 1
    done = json.loads((run_dir / "result.json").read_text())
    assert done["step"] == 300 and done["restart"] == 1 and 0 < done["resumed_from"] < 300, done
    assert abs(done["weight"] - 3) < 0.05 and abs(done["bias"] + 1) < 0.05, done
    status = json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=tmp_path).stdout)
    assert status["state"] == "completed" and status["restarts"] == 1, status


def _preempt_once_and_complete(cluster, tmp_path, name: str, *command: str) -> tuple[Path, dict]:
    """Submit an example on 2 nodes, send hpc-train's signal (USR2) once both ranks step, and follow it through
    the requeue to COMPLETED; the run directory and the example's result.json."""
    out = json.loads(hpc(cluster, "submit", "--nodes", "2", "--gpus", "1", "--name", name, "--json", "--",
                         *_slow_first_launch(*command), cwd=tmp_path).stdout.splitlines()[-1])
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    wait_for(lambda: _stepping(run_dir), 240, "both ranks stepping")
    harness.run_slurm(["scancel", "--signal=USR2", job_id], env=cluster.env)
    assert wait_state(cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=420) == "COMPLETED"
    assert _restart_count(job_id, cluster.env) == 1
    status = json.loads(hpc(cluster, "status", job_id, "--json", cwd=tmp_path).stdout)
    assert status["state"] == "completed" and status["restarts"] == 1, status
    report = json.loads(hpc(cluster, "report", name, "--json", cwd=tmp_path).stdout)
    (row,) = report["configurations"]
    assert row["counts"] == {"finished": 1, "running": 0, "failed": 0}, row
    logs = "".join(path.read_text() for path in (run_dir / "logs").glob("*.log"))  # under srun: batch.log
    assert "leaving with 75" in logs and "terminate called" not in logs, logs
    return run_dir, json.loads((run_dir / "result.json").read_text())


def test_accelerate_example_is_preempted_requeued_resumed_and_completed(slurm_cluster, tmp_path):
    import accelerate  # noqa: F401 - the `clients` extra: missing, the test fails (it does not skip)

    run_dir, done = _preempt_once_and_complete(slurm_cluster, tmp_path, "acc", "accelerate_script.py",
                                               "--steps", "300", "--step-s", "0.05")
    assert done["step"] == 300 and done["restart"] == 1 and done["world_size"] == 2, done
    assert 0 < done["resumed_from"] < 300, done  # signalled after both ranks' first heartbeat (a step done)
    assert abs(done["weight"] - 3) < 0.05 and abs(done["bias"] + 1) < 0.05, done
    assert (run_dir / "checkpoints" / "latest").read_text() == f"state-{done['resumed_from']}"


def test_hf_trainer_example_is_preempted_requeued_resumed_and_completed(slurm_cluster, tmp_path):
    import transformers  # noqa: F401 - the `clients` extra: missing, the test fails (it does not skip)

    run_dir, done = _preempt_once_and_complete(slurm_cluster, tmp_path, "hf", "hf_trainer.py",
                                               "--steps", "300", "--step-s", "0.05")
    assert done["step"] == 300 and done["restart"] == 1 and done["world_size"] == 2, done
    assert 0 < done["resumed_from"] < 300, done
    assert (run_dir / "checkpoints" / "trainer" / f"checkpoint-{done['resumed_from']}" / "hpc-train-complete").exists()


def test_lightning_example_is_preempted_requeued_resumed_and_completed(slurm_cluster, tmp_path):
    # Under srun Lightning on its own picks SLURMEnvironment and its SIGUSR1 auto-requeue; hpc-train's USR2 would end
    # the ranks (`failed: killed by signal 12`). With hpc_train.integrations.lightning: checkpoint, 75, hpc-train's
    # requeue (restart count 1, the state log), resume, completed, as for the shared trainer.
    out = json.loads(hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "1", "--name", "lit", "--json", "--",
                         *_slow_first_launch("lightning_module.py", "--steps", "200", "--step-s", "0.02"),
                         cwd=tmp_path).stdout.splitlines()[-1])
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    wait_for(lambda: _stepping(run_dir), 300, "both ranks stepping")
    harness.run_slurm(["scancel", "--signal=USR2", job_id], env=slurm_cluster.env)
    assert wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=400) == "COMPLETED"
    assert _restart_count(job_id, slurm_cluster.env) == 1
    done = json.loads((run_dir / "result.json").read_text())
    assert done["world_size"] == 2 and done["batches_per_epoch"] == 64, done
    assert done["step"] == 200 and done["restart"] == 1 and 0 < done["resumed_from"] < 200, done
    assert abs(done["weight"] - 3) < 0.05 and abs(done["bias"] + 1) < 0.05, done
    status = json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=tmp_path).stdout)
    assert status["state"] == "completed" and status["restarts"] == 1, status
    report = json.loads(hpc(slurm_cluster, "report", "lit", "--json", cwd=tmp_path).stdout)
    (configuration,) = report["configurations"]
    assert configuration["counts"] == {"finished": 1, "running": 0, "failed": 0}, configuration
