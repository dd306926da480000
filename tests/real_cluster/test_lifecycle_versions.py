"""The submission lifecycle with torch-free commands, run on every Slurm version the harness has (22.05 from the
host, 24.11 and 26.05 from their chroots: ``HPCTRAIN_SLURM_VERSION=24.11 pytest -m lifecycle tests/real_cluster``;
tests/cluster/versions.sh): status / logs / cancel of a running command, ``--dry-run``'s ``sbatch --test-only``
verdict and a refusal, and a hung rank requeued away from its node, completing on the others. hpc-train itself runs
where the version's jobs run (``cluster.python``), with that version's own sbatch, squeue, sacct and scontrol.
The mapping and the USR2 requeue of a command: tests/real_cluster/test_commands.py (also ``lifecycle``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_train.runs.bad_nodes import excluded_names
from tests.cluster import harness
from tests.hang_helpers import follow, stop_rank, wait_for_beats
from tests.real_cluster.test_lifecycle import _restart_count, hpc, wait_for, wait_state

pytestmark = [pytest.mark.timeout(420), pytest.mark.lifecycle]

BEAT = str(Path(__file__).resolve().parents[1] / "scripts" / "beat.py")


def _submit(cluster, work: Path, name: str, *args: str) -> tuple[str, Path]:
    out = hpc(cluster, "submit", "--name", name, "--json", *args, cwd=work)
    data = json.loads(out.stdout.splitlines()[-1])
    return data["job_id"], Path(data["run_dir"])


def _watchdog_lines(run_dir: Path) -> str:
    log = run_dir / "logs" / "batch.log"
    return "\n".join(line for line in log.read_text(errors="replace").splitlines() if "watchdog" in line) if log.exists() else ""


def _status(cluster, work: Path, ref: str) -> dict:
    return json.loads(hpc(cluster, "status", ref, "--json", cwd=work).stdout)


def test_status_logs_and_cancel_of_a_running_command(slurm_cluster, tmp_path):
    job, run_dir = _submit(slurm_cluster, tmp_path, "beat", "--nodes", "2", "--tasks-per-node", "1", "--",
                           slurm_cluster.job_python, BEAT, "3000")
    wait_for_beats(run_dir, 2, timeout_s=90)
    row = _status(slurm_cluster, tmp_path, job)
    assert row["state"] == "running" and row["source"] == "squeue" and row["nodes"], row
    logs = hpc(slurm_cluster, "logs", "beat", "--rank", "1", cwd=tmp_path).stdout
    assert "rank 1 on gpu02: restart 0, from step 0" in logs, logs
    assert "cancelled beat/" in hpc(slurm_cluster, "cancel", job, cwd=tmp_path).stdout
    assert wait_state(slurm_cluster, job, {"CANCELLED"}) == "CANCELLED"
    final = wait_for(lambda: (s := _status(slurm_cluster, tmp_path, job))["source"] == "sacct" and s, 60,
                     "the cancelled job in sacct")
    assert final["state"] == "cancelled" and final["slurm_state"] == "CANCELLED", final


def test_dry_run_gives_slurms_verdict_and_a_refusal_queues_nothing(slurm_cluster, tmp_path):
    command = ["--", slurm_cluster.job_python, BEAT, "10"]
    good = hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "2", "--partition", "gpu", "--account", "research",
               "--dry-run", *command, cwd=tmp_path)
    assert "preflight: partition gpu: ok" in good.stderr and "preflight: account research: ok" in good.stderr
    assert "preflight: sbatch --test-only: " in good.stderr and "to start at" in good.stderr, good.stderr
    before = harness.run_slurm(["squeue", "-h", "-o", "%i"]).stdout
    for args, reason in ((["--partition", "nope"], "invalid partition"), (["--account", "nope"], "invalid account")):
        for dry in ([], ["--dry-run"]):
            bad = hpc(slurm_cluster, "submit", *args, *dry, *command, cwd=tmp_path, check=False)
            assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stdout + bad.stderr
            assert len(bad.stderr.strip().splitlines()) <= 2, bad.stderr  # sbatch's own lines are not passed through
            # submit: Slurm's reason; --dry-run: Slurm's, or the preflight's own naming the value ("partition 'nope'
            # does not exist on this cluster")
            assert reason in bad.stderr.lower() or (dry and "'nope'" in bad.stderr), bad.stderr
    assert harness.run_slurm(["squeue", "-h", "-o", "%i"]).stdout == before
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("run.json"))


def test_a_hung_rank_is_requeued_away_from_its_node_and_the_command_completes(slurm_cluster_3, tmp_path):
    # The watchdog acts once no rank has advanced: rank 0 counts its 150 steps (15 s, the time there is to stop
    # rank 1 once both beat) and ends, then 10 s later the hang is rank 1's. The requeued attempt steps at 0.01 s:
    # it has only to finish (at 0.1 s it took 15 s more, and 40 s at the 400 steps this test had before).
    cluster, steps = slurm_cluster_3, 150
    job, run_dir = _submit(cluster, tmp_path, "hang", "--nodes", "2", "--tasks-per-node", "1",
                           "--set", "slurm.hang_timeout_s=10", "--set", "slurm.hang_action=requeue", "--",
                           cluster.job_python, BEAT, str(steps), "0.01")
    beats = wait_for_beats(run_dir, 2, timeout_s=90)
    wait_for(lambda: (run_dir / "checkpoints" / "rank-1.json").exists(), 30, "rank 1's first checkpoint")
    bad = beats[1].host
    _, hung_at = stop_rank(run_dir, 1)
    try:
        seen = follow(lambda: _status(cluster, tmp_path, job), hung_at, timeout_s=240)
    except AssertionError as exc:  # e.g. stranded in "requeued (job requeued in held state)": issue 26's race
        raise AssertionError(f"{exc}\nthe watchdog's lines in the batch log:\n{_watchdog_lines(run_dir)}") from None
    assert seen.end[1] == "completed", (seen.states[-5:], _watchdog_lines(run_dir))
    row = _status(cluster, tmp_path, job)
    assert row["restarts"] == 1 and row["excluded_nodes"] == [bad], row
    assert excluded_names(run_dir) == [bad] and _restart_count(job, cluster.env) == 1
    shown = harness.run_slurm(["scontrol", "show", "job", job], env=cluster.env).stdout
    assert f"ExcNodeList={bad}" in shown, shown
    done = [json.loads((run_dir / f"done-{rank}.json").read_text()) for rank in range(2)]
    assert all(d["step"] == steps and d["restart"] == 1 and d["resumed_from"] > 0 for d in done), done
    assert bad not in {d["host"] for d in done}, done
    assert wait_state(cluster, job, {"COMPLETED"}) == "COMPLETED"


def test_a_sweep_is_one_held_array_with_its_limit_and_cancel_ends_every_point(slurm_cluster, tmp_path):
    """A sweep as Slurm's array on every version: one array (``%N`` from --max-parallel), every point's status while
    it waits (squeue's range record), and every point ``cancelled`` after one ``cancel`` (sacct's pending-cancelled
    range record, ``15_[0-2%2]``, on every version). The points never start (a begin time an hour away), so the
    trainer's sweep needs no torch where the job would run."""
    cluster = slurm_cluster
    data = json.loads(hpc(cluster, "submit", "digits_lt_demo", "--tasks-per-node", "1", "--set", "train.device=cpu",
                          "--name", "swept", "--json", "--sweep", "train.seed=0,1,2", "--max-parallel", "2",
                          "--set", "slurm.extra_sbatch={begin: now+3600}", cwd=tmp_path).stdout.splitlines()[-1])
    array = data["job_id"]
    shown = harness.run_slurm(["scontrol", "show", "job", array], env=cluster.env).stdout
    assert "ArrayTaskThrottle=2" in shown and f"ArrayJobId={array}" in shown, shown
    points = [f"swept/{array}_{i}" for i in range(3)]
    waiting = [_status(cluster, tmp_path, p) for p in points]
    assert [r["state"] for r in waiting] == ["queued"] * 3, waiting
    assert hpc(cluster, "cancel", "swept", cwd=tmp_path).returncode == 0
    wait_for(lambda: not harness.run_slurm(["squeue", "-h", "-j", array, "-o", "%i"], env=cluster.env,
                                           check=False).stdout.strip(), 60, "the array left squeue")
    ended = wait_for(lambda: (rows := [_status(cluster, tmp_path, p) for p in points])
                     and all(r["source"] == "sacct" for r in rows) and rows, 60, "every point in sacct")
    assert [(r["state"], r["slurm_state"]) for r in ended] == [("cancelled", "CANCELLED")] * 3, ended
    assert not any("None assigned" in json.dumps(r) for r in ended), ended
