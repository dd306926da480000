"""End to end on the harness cluster (2 nodes x 4 fake GPUs, train.device=cpu, gloo): submit, the rank
mapping every task really saw, the admin's plain-sbatch path, torchrun, status / logs -f / cancel,
preemption and requeue, the time-limit path and --resume, arrays, a crashing rank, impossible requests.

Each Slurm job costs seconds on 2 cores, so assertions are merged into few jobs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train.config import SiteConfig, resolve_job, spec_from_yaml_text
from hpc_train.render import LaunchSpec, render_sbatch
from hpc_train.resources import jobs_dir, templates_dir
from hpc_train.runs import rundir
from hpc_train.slurm.submitit_hook import submitit_launch
from tests.cluster import harness

pytestmark = pytest.mark.timeout(600)

DEMO = ["digits_lt_demo", "--set", "train.device=cpu", "--set", "train.schedule.warmup_epochs=0"]


def hpc(cluster, *args, cwd: Path, check: bool = True, timeout: float = 300, env_extra=None):
    env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}:{cluster.env.get('PATH', os.environ['PATH'])}",
           **(env_extra or {})}
    env.pop("HPC_TRAIN_SITE", None)
    env["HPC_TRAIN_STATE_DIR"] = str(cwd / ".state")  # the run index of these tests, not the user's
    env.update(env_extra or {})
    # cluster.python: where this Slurm version's jobs run (the host's venv on 22.05, a chroot's on 24.11 / 26.05)
    result = subprocess.run([cluster.python, "-m", "hpc_train.cli", *args], capture_output=True, text=True,
                            cwd=cwd, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"hpc-train {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def submit_json(cluster, *args, cwd: Path, **kw):
    result = hpc(cluster, "submit", *args, "--json", cwd=cwd, **kw)
    return json.loads(result.stdout.strip().splitlines()[-1])


def wait_state(cluster, job_id: str, want: set[str], timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = harness.job_state(job_id, env=cluster.env) or harness.sacct_state(job_id, env=cluster.env)
        if state in want:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not reach {want} within {timeout_s} s (last: {state})")


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def steps_per_epoch(run_dir: Path) -> int:
    """Optimizer steps of one epoch of the run, from what it trains on (rank 0's class counts) and its global
    batch: the instance sampler's ceil(N / B) at any world size (the last batch is split, not dropped)."""
    counts = json.loads((run_dir / "class_counts.json").read_text())["train_counts"]
    batch = spec_from_yaml_text((run_dir / rundir.JOB_YAML).read_text(), "job.yaml").train.batch_size
    return -(-sum(counts) // batch)


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()  # evaluations (not the ranks' compute times)
            if line.strip() and '"record": ' not in line] if path.exists() else []


def rank_records(run_dir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (run_dir / "ranks").glob("rank-*.json")), key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("slurm-e2e")


# ------------------------------------------------------------------------------------------------
# 1. submit --wait: what each rank saw == simulate == plain srun's Slurm variables; logs; status
# ------------------------------------------------------------------------------------------------

def test_submit_ranks_logs_status(slurm_cluster, work):
    out = submit_json(slurm_cluster, "--nodes", "2", "--gpus", "2", *DEMO, "--set", "train.epochs=2", "--wait",
                      cwd=work)
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    assert out["cluster"] == "slurm" and run_dir == work / "runs" / "digits-lt-demo" / job_id

    seen = rank_records(run_dir)
    assert [r["rank"] for r in seen] == [0, 1, 2, 3]
    predicted = json.loads(hpc(slurm_cluster, "simulate", "--nodes", "2", "--gpus", "2", "--nodelist",
                               slurm_cluster.nodelist, "--job-id", job_id, "--json", cwd=work).stdout)
    keys = ("rank", "local_rank", "node_rank", "world_size", "master_addr", "master_port")
    assert [{k: r[k] for k in keys} | {"host": r["hostname"]} for r in seen] == \
        [{k: p[k] for k in keys} | {"host": p["host"]} for p in predicted]
    # What Slurm itself says for the same shape on the same nodes.
    srun = harness.run_slurm(["srun", "-N2", "--ntasks-per-node=2", "-w", slurm_cluster.nodelist, "bash", "-c",
                              "echo $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $(hostname)"], env=slurm_cluster.env)
    from_slurm = sorted(tuple(line.split()) for line in srun.stdout.splitlines() if line.strip())
    assert from_slurm == sorted((str(r["rank"]), str(r["local_rank"]), str(r["node_rank"]), r["hostname"]) for r in seen)
    assert {r["source"] for r in seen} == {"slurm"} and {r["device"] for r in seen} == {"cpu"}

    evals = metrics(run_dir)
    assert [m["epoch"] for m in evals if m.get("phase") == "main"] == [1, 2]
    assert {"top1", "balanced", "many", "medium", "few", "per_class"} <= set(evals[-1])
    assert (run_dir / "job.sbatch").read_text().startswith("#!/bin/bash")
    record = json.loads((run_dir / "run.json").read_text())
    assert record["job_id"] == job_id and record["world_size"] == 4

    logs = hpc(slurm_cluster, "logs", job_id, cwd=work).stdout
    for rank in range(4):
        assert f"[rank {rank}] " in logs, f"rank {rank} missing from logs"
    status = json.loads(hpc(slurm_cluster, "status", f"digits-lt-demo/{job_id}", "--json", cwd=work).stdout)
    assert status["state"] == "completed" and status["progress"]["epoch"] == 2
    assert status["slurm_state"] == "COMPLETED" and status["exit_code"] == 0
    assert evals[-1]["global_step"] == 2 * steps_per_epoch(run_dir)


# ------------------------------------------------------------------------------------------------
# 2. The admin path: the script `render` prints, submitted with plain sbatch, runs the same job
# ------------------------------------------------------------------------------------------------

def test_rendered_script_with_plain_sbatch(slurm_cluster, work):
    script = work / "plain.sbatch"
    hpc(slurm_cluster, "render", "--nodes", "2", "--gpus", "2", *DEMO, "--set", "train.epochs=1",
        "--name", "plain-admin", "-o", str(script), cwd=work)
    job_id = _sbatch(slurm_cluster, script, work)
    assert wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}) == "COMPLETED"
    run_dir = work / "runs" / "plain-admin" / job_id
    assert sorted(p.name for p in (run_dir / "logs").glob("rank-*.log")) == [f"rank-{r}.log" for r in range(4)]
    assert len(rank_records(run_dir)) == 4 and metrics(run_dir)[-1]["epoch"] == 1
    # The job the ranks ran is the job render resolved ($HT_JOB_YAML -> job.yaml).
    expected, _ = resolve_job(jobs_dir() / "digits_lt_demo.yaml",
                              site=SiteConfig(None, {}, ()), sets=["train.device=cpu", "train.schedule.warmup_epochs=0", "train.epochs=1"],
                              flags={"slurm.nodes": 2, "slurm.gpus_per_node": 2, "name": "plain-admin"})
    from hpc_train.config import spec_from_yaml_text

    assert spec_from_yaml_text((run_dir / "job.yaml").read_text(), "job.yaml") == expected
    # status/logs work on a run that hpc-train did not submit (no run.json).
    status = json.loads(hpc(slurm_cluster, "status", str(run_dir), "--json", cwd=work).stdout)
    assert status["state"] == "completed" and status["exit_code"] == 0  # the script's exit block said so
    assert "[rank 3] " in hpc(slurm_cluster, "logs", str(run_dir), cwd=work).stdout


def _sbatch(cluster, script: Path, cwd: Path) -> str:
    result = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=cwd,
                            env={**cluster.env, "PATH": f"{Path(sys.executable).parent}:{cluster.env['PATH']}"},
                            check=True)
    return result.stdout.strip().split(";")[0]


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
@pytest.mark.parametrize("form", ["plain", "submitit"])
@pytest.mark.parametrize("container", [None, "apptainer", "pyxis"])
def test_every_template_variant_passes_sbatch_test_only(slurm_cluster, work, launcher, form, container):
    sets = ["slurm.partition=gpu", "slurm.account=research", "slurm.time=00:10:00", "slurm.exclusive=false",
            "slurm.extra_sbatch={comment: test-only}"]
    if container == "apptainer":
        sets.append("slurm.container={image: /images/lt.sif}")
    elif container == "pyxis":
        sets += ["slurm.container={runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.05-py3'}", "slurm.gpu_flag=gres"]
    spec, _ = resolve_job(None, site=SiteConfig(None, {}, ()), sets=sets,
                          flags={"slurm.nodes": 2, "slurm.gpus_per_node": 2, "slurm.launcher": launcher})
    launch = LaunchSpec()
    if form == "submitit":
        folder = work / "runs" / spec.name / ".submitit"
        launch = submitit_launch(folder, f"python -u -m submitit.core._submit {folder}")
    script = work / f"test-only-{launcher}-{form}-{container}.sbatch"
    script.write_text(render_sbatch(spec, runs_root=str(work / "runs"), python=sys.executable, launch=launch))
    result = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=work,
                            env=slurm_cluster.env)
    assert result.returncode == 0 and "to start at" in result.stderr, result.stderr


# ------------------------------------------------------------------------------------------------
# 3. torchrun across 2 nodes
# ------------------------------------------------------------------------------------------------

def test_torchrun_launcher_two_nodes_with_preemption(slurm_cluster, work):
    """torchrun, one per node; the time-limit signal goes to the batch shell only (B:), which forwards it
    to the workers; they checkpoint, rank 0 requeues, the job resumes and ends with the exact step count."""
    epochs = 10
    out = submit_json(slurm_cluster, "--nodes", "2", "--gpus", "2", "--launcher", "torchrun", *DEMO,
                      "--set", f"train.epochs={epochs}", "--name", "torchrun-demo", cwd=work)
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    env = slurm_cluster.env
    wait_for(lambda: len(metrics(run_dir)) >= 2, 120, "two epochs")
    harness.run_slurm(["scancel", "--batch", "--signal=USR2", job_id], env=env)  # as Slurm does with B:
    assert wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=240) == "COMPLETED"
    assert _restart_count(job_id, env) == 1
    seen = rank_records(run_dir)
    assert [r["rank"] for r in seen] == [0, 1, 2, 3]
    assert {r["source"] for r in seen} == {"torchrun"}
    assert {(r["node_rank"], r["hostname"]) for r in seen} == {(0, "gpu01"), (1, "gpu02")}
    final = _status_json(run_dir)
    assert final["state"] == "completed" and final["global_step"] == epochs * steps_per_epoch(run_dir)
    job = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=1" in job and "#SBATCH --signal=B:USR2@" in job
    assert "got USR2, forwarding it to the workers" in (run_dir / "logs" / "batch.log").read_text()


# ------------------------------------------------------------------------------------------------
# 4. status / logs -f / cancel on a running job
# ------------------------------------------------------------------------------------------------

def test_status_logs_follow_cancel(slurm_cluster, work):
    out = submit_json(slurm_cluster, "--nodes", "1", "--gpus", "2", *DEMO, "--set", "train.epochs=400",
                      "--name", "to-cancel", cwd=work)
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    wait_for(lambda: metrics(run_dir), 120, "the first evaluation")
    status = json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=work).stdout)
    assert status["state"] == "running" and status["source"] == "squeue" and status["nodes"]
    follower = subprocess.Popen([sys.executable, "-m", "hpc_train.cli", "logs", "to-cancel", "-f", "--rank", "0"],
                                cwd=work, env={**slurm_cluster.env}, stdout=subprocess.PIPE, text=True)
    time.sleep(3)
    assert "cancelled to-cancel/" in hpc(slurm_cluster, "cancel", job_id, cwd=work).stdout
    assert wait_state(slurm_cluster, job_id, {"CANCELLED"}) == "CANCELLED"
    followed, _ = follower.communicate(timeout=60)  # -f ends by itself once the job has ended
    assert follower.returncode == 0 and "[rank 0] " in followed and "epoch" in followed
    final = wait_for(lambda: (s := json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=work).stdout))
                     ["source"] == "sacct" and s, 30, "the cancelled job in sacct")
    assert final["state"] == "cancelled" and final["slurm_state"] == "CANCELLED"


# ------------------------------------------------------------------------------------------------
# 5. Preemption signal and external requeue mid-run: resumes, same optimizer steps
# ------------------------------------------------------------------------------------------------

def _status_json(run_dir: Path) -> dict:
    """What the run directory says (hpc_train.runs.rundir): the state and the trainer's last progress."""
    state = rundir.read_state(run_dir)
    return {"state": state.state, **state.progress}


def test_usr2_and_scontrol_requeue_resume_to_the_same_step_count(slurm_cluster, work):
    epochs = 14
    out = submit_json(slurm_cluster, "--nodes", "2", "--gpus", "2", *DEMO, "--set", f"train.epochs={epochs}",
                      "--name", "preempted", cwd=work)
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    env = slurm_cluster.env
    wait_for(lambda: len(metrics(run_dir)) >= 2, 120, "two epochs")
    harness.run_slurm(["scancel", "--signal=USR2", job_id], env=env)
    wait_for(lambda: _restart_count(job_id, env) >= 1 and harness.job_state(job_id, env=env) == "RUNNING", 120,
             "the requeued job running")
    before = len(metrics(run_dir))
    wait_for(lambda: len(metrics(run_dir)) >= before + 2, 120, "progress after the first requeue")
    harness.run_slurm(["scontrol", "requeue", job_id], env=env)  # an external requeue: no signal first
    assert wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=240) == "COMPLETED"
    assert _restart_count(job_id, env) == 2
    final = _status_json(run_dir)
    assert final["state"] == "completed" and final["epoch"] == epochs
    assert final["global_step"] == epochs * steps_per_epoch(run_dir)
    log = (run_dir / "logs" / "batch.log").read_text()
    assert "restart 1" in log and "restart 2" in log


def _restart_count(job_id: str, env) -> int:
    text = harness.run_slurm(["scontrol", "show", "job", job_id], env=env, check=False).stdout
    m = re.search(r"Restarts=(\d+)", text)
    return int(m.group(1)) if m else 0


def test_time_limit_cap_then_resume(slurm_cluster, work):
    epochs = 4000  # far more than fits in two instances of a 1-minute limit (one instance trained 332 in 36 s)
    # slurmctld sends --signal at its 30 s periodic check once the signal is due within 30 s, so with a
    # 60 s limit the signal comes at t = 60 - delay - [0, 30) s. A delay of 20 s puts it 10 s or more after
    # the start, when the step's ranks exist and have their handler (a signal that comes before the step
    # is launched is lost, and the job times out), and leaves 20 s or more to checkpoint before the limit.
    out = submit_json(slurm_cluster, "--nodes", "1", "--gpus", "2", *DEMO, "--set", f"train.epochs={epochs}",
                      "--set", "slurm.signal_delay_s=20", "--set", "slurm.max_requeues=1", "--time", "1",
                      "--name", "time-limit", cwd=work)
    job_id, run_dir = out["job_id"], Path(out["run_dir"])
    env = slurm_cluster.env
    # Signal -> checkpoint -> requeue (restart 1) -> signal again -> checkpoint, cap reached -> exit 75.
    state = wait_state(slurm_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout_s=300)
    assert state == "FAILED" and _restart_count(job_id, env) == 1
    stopped = _status_json(run_dir)
    assert stopped["state"] == "preempted" and 0 < stopped["epoch"] < epochs
    status = json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=work).stdout)
    assert status["state"] == "preempted" and status["exit_code"] == 75
    assert status["slurm_state"] == "FAILED" and status["slurm_exit_code"].startswith("75:")
    assert "--resume" in status["hint"]
    # Continue it in a new job (`--set` may change the run's length: here, a few epochs past the checkpoint).
    until = stopped["epoch"] + 3
    # --chain 2: a second job queued after the first (afterany) resumes too, finding the run complete.
    resumed = submit_json(slurm_cluster, "--resume", f"time-limit/{job_id}", "--time", "30", "--chain", "2",
                          "--set", f"train.epochs={until}", "--wait", cwd=work)
    assert resumed["run_dir"] == str(run_dir) and resumed["job_id"] != job_id and len(resumed["tasks"]) == 2
    second = resumed["tasks"][1]
    assert wait_state(slurm_cluster, second, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    final = _status_json(run_dir)
    assert final["state"] == "completed" and final["epoch"] == until
    assert final["global_step"] == until * steps_per_epoch(run_dir)  # the second job trained no further
    record = json.loads((run_dir / "run.json").read_text())
    assert [c["job_id"] for c in record["continued_by"]] == resumed["tasks"]
    dependency = (run_dir / f"job-{second}.sbatch").read_text()
    assert f"#SBATCH --dependency=afterany:{resumed['job_id']}" in dependency


# ------------------------------------------------------------------------------------------------
# 6. Arrays, a crashing rank, impossible requests
# ------------------------------------------------------------------------------------------------

def test_array_of_three(slurm_cluster, work):
    out = submit_json(slurm_cluster, "--nodes", "1", "--gpus", "2", *DEMO, "--set", "train.epochs=1",
                      "--name", "sweep", "--sweep", "train.seed=0,1,2", "--max-parallel", "2", "--wait", cwd=work)
    assert len(out["tasks"]) == 3
    seeds = []
    for task in out["tasks"]:
        run_dir = work / "runs" / "sweep" / task
        assert metrics(run_dir)[-1]["epoch"] == 1
        seeds.append(json.loads((run_dir / "config.json").read_text())["train"]["seed"])
        assert "--array=0-2%2" in (run_dir / "job.sbatch").read_text()
        assert json.loads(hpc(slurm_cluster, "status", task, "--json", cwd=work).stdout)["state"] == "completed"
    assert seeds == [0, 1, 2]


def test_crashing_rank_is_named(slurm_cluster, work):
    # A site template (what an admin could ship) whose rank 3 dies at start: kill-on-bad-exit must end the
    # job quickly and status/logs must name rank 3 and its host.
    site_dir = work / "crash-site"
    (site_dir / "partials").mkdir(parents=True)
    original = (templates_dir() / "partials" / "launch_srun.j2").read_text()
    crashing = original.replace('    "$PYTHON" -u -m hpc_train.train --resolved "$RUN_DIR/job.yaml"',
                                '    bash -c \'if [ "$SLURM_PROCID" = 3 ]; then echo "boom on $(hostname)" >&2; exit 7; fi; '
                                'exec "$@"\' crash "$PYTHON" -u -m hpc_train.train --resolved "$RUN_DIR/job.yaml"')
    assert '    "${HT_LAUNCH_COMMAND[@]}"\n' in crashing  # submit's (submitit) form: the line this test changes
    crashing = crashing.replace('    "${HT_LAUNCH_COMMAND[@]}"\n',
                                '    bash -c \'if [ "$SLURM_PROCID" = 3 ]; then echo "boom on $(hostname)" >&2; exit 7; fi; '
                                'exec "$@"\' crash "${HT_LAUNCH_COMMAND[@]}"\n')
    assert crashing != original
    (site_dir / "partials" / "launch_srun.j2").write_text(crashing)
    site_file = work / "crash-site.yaml"
    site_file.write_text(f"template_dirs: [{site_dir}]\n")
    started = time.monotonic()
    result = hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "2", *DEMO, "--set", "train.epochs=50",
                 "--name", "crashing", "--wait", cwd=work, check=False, env_extra={"HPC_TRAIN_SITE": str(site_file)})
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 120
    job_id = re.search(r"job (\d+)", result.stdout + result.stderr).group(1)
    status = json.loads(hpc(slurm_cluster, "status", job_id, "--json", cwd=work).stdout)
    assert status["state"] == "failed"
    assert status["first_failure"].startswith("rank 3 on gpu02")
    logs = hpc(slurm_cluster, "logs", job_id, cwd=work)
    assert "boom on gpu02" in logs.stdout and "first failure: rank 3 on gpu02" in logs.stderr


def test_a_data_error_on_the_ranks_is_exit_2_with_its_reason(slurm_cluster, work):
    # The job's own runs_dir (not ./runs): status finds the run by name all the same (the run index).
    job = work / "elsewhere.yaml"
    job.write_text("name: data-error\nruns_dir: elsewhere-runs\ntrain:\n  data: {name: cifar10-lt, root: /nonexistent}\n")
    result = hpc(slurm_cluster, "submit", str(job), "--nodes", "1", "--gpus", "2", "--set", "train.device=cpu",
                 "--wait", cwd=work, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    error = result.stderr.strip().splitlines()[-2:]
    assert "missing data_batch_1" in error[0] and "Traceback" not in result.stderr
    status = json.loads(hpc(slurm_cluster, "status", "data-error", "--json", cwd=work).stdout)
    assert status["state"] == "failed" and "missing data_batch_1" in status["reason"] and status["exit_code"] == 2
    assert status["run_dir"].startswith(str(work / "elsewhere-runs" / "data-error"))


@pytest.mark.parametrize(
    "args,reason",
    [(["--gpus", "5", "--set", "train.batch_size=60"], "Requested node configuration is not available"),
     (["--partition", "nope"], "invalid partition"),
     (["--account", "nope"], "Invalid account")],
)
def test_impossible_requests_exit_2_with_slurms_reason(slurm_cluster, work, args, reason):
    result = hpc(slurm_cluster, "submit", *DEMO, "--set", "train.epochs=1", *args, cwd=work, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert reason.lower() in result.stderr.lower() and "Traceback" not in result.stderr
    dry = hpc(slurm_cluster, "submit", *DEMO, *args, "--dry-run", cwd=work, check=False)
    assert dry.returncode == 2 and "Traceback" not in dry.stderr


def test_dry_run_preflight_on_a_good_job(slurm_cluster, work):
    result = hpc(slurm_cluster, "submit", "--nodes", "2", "--gpus", "2", *DEMO, "--partition", "gpu",
                 "--account", "research", "--dry-run", cwd=work)
    assert "#SBATCH --gpus-per-node=2" in result.stdout  # Slurm 22.05 picks --gpus-per-node
    assert "preflight: partition gpu: ok" in result.stderr and "preflight: account research: ok" in result.stderr
    assert "preflight: sbatch --test-only: " in result.stderr and "to start at" in result.stderr
