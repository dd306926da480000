"""The README's exit-code contract, case by case (issue 11, items 1-15): bad input exits 2 with one or two
lines, writes nothing, queues nothing and shows no traceback; runs are found wherever their job put them.
Everything runs through the real console entry point; Slurm, where needed, is a stand-in on PATH."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import assert_refused, cli, script_values, tree


def no_slurm_env(tmp_path):
    site = tmp_path / "empty-site.yaml"
    site.write_text("{}\n")
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
            "HPC_TRAIN_SITE": str(site), "HPC_TRAIN_STATE_DIR": str(tmp_path / "state"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


@pytest.mark.parametrize("args,message", [
    # 5. impossible places and names
    (["submit", "--cluster", "local", "--runs-dir", "/proc/x"], "cannot create /proc/x"),
    (["submit", "--cluster", "local", "--name", "n" * 300], "name: 300 characters; a job name has at most 128"),
    (["render", "--name", "n" * 300], "name: 300 characters"),
    (["render", "-o", "/nonexistent/d/x.sbatch"], "cannot write /nonexistent/d/x.sbatch: No such file or directory"),
    (["templates", "export", "/proc/t"], "cannot create /proc/t"),
    (["jobs", "export", "/proc/j"], "cannot create /proc/j"),
    # 3. '%' would be expanded by Slurm in log paths
    (["render", "--name", "run%j"], "no '/', '%'"),
    (["submit", "--cluster", "local", "--runs-dir", "runs%u"], "cannot hold '%'"),
    # 6. only small regular files are read
    (["render", "/dev/zero"], "job file /dev/zero is not a regular file"),
    (["render", "--sweep-file", "fifo.yaml"], "sweep file fifo.yaml is not a regular file"),  # would block
    # 9. non-finite numbers, absurd sizes
    (["render", "--nodes", "100000000000000000000"], "slurm.nodes: 100000000000000000000 is out of range"),
    (["render", "--nodes", "200000"], "slurm.nodes must be between 1 and 100,000"),
    (["render", "--set", "train.optim.lr=.nan"], "train.optim.lr: must be a finite number, got '.nan'"),
    (["render", "--set", "train.data.imbalance_factor=.inf"], "must be a finite number"),
    (["render", "--sweep", "train.seed=[" + ",".join(map(str, range(20001))) + "]"], "20,001 sweep points"),
    (["simulate", "--nodes", "2", "--nodelist", "gpu[1-99999999]"], "has 99,999,999 hosts but the job asks for 2"),
    (["simulate", "--nodes", "20000", "--gpus", "8", "--set", "train.batch_size=160000"],
     "simulate shows at most 100,000"),
    # 10. YAML read as written; duplicate keys refused
    (["render", "dup.yaml"], "dup.yaml:3:1: duplicate key 'slurm'"),
    (["render", "--set", "slurm.nodes=0x10"], "slurm.nodes: must be an integer, got '0x10'"),
    # 12. keys hpc-train writes itself; NUL bytes
    (["render", "--set", "slurm.extra_sbatch={nodes: 8}"], "'nodes' is written by hpc-train itself; use slurm.nodes"),
    (["render", "--set", "slurm.extra_sbatch={wrap: 'rm -rf ~'}"], "'wrap' is written by hpc-train itself"),
    (["render", "nul.yaml"], "NUL byte"),
])
def test_bad_input_exits_2_writes_nothing(tmp_path, args, message):
    (tmp_path / "dup.yaml").write_text("slurm:\n  nodes: 1\nslurm:\n  nodes: 2\n")
    (tmp_path / "nul.yaml").write_text('slurm:\n  partition: "gpu\\0; touch PWNED"\n')
    os.mkfifo(tmp_path / "fifo.yaml")
    env = no_slurm_env(tmp_path)
    before = tree(tmp_path)
    started = time.monotonic()
    result = cli(*args, cwd=tmp_path, env=env, timeout=60)
    assert_refused(result, message)
    assert time.monotonic() - started < 20, "bounded inputs must be refused at once"
    assert tree(tmp_path) == before, "bad input must not write anything"


def test_yaml_values_reach_the_script_as_written(tmp_path):
    (tmp_path / "job.yaml").write_text("slurm:\n  env: {FOO: 010, HEX: 0x10, ON: on, BIG: 1_000}\ntrain:\n  amp: off\n")
    result = cli("render", "job.yaml", "--set", "train.amp=off", cwd=tmp_path, env=no_slurm_env(tmp_path))
    assert result.returncode == 0, result.stderr
    for line in ("export FOO=010", "export HEX=0x10", "export ON=on", "export BIG=1_000"):
        assert line in result.stdout.splitlines()
    assert "  amp: 'off'" in script_values(result.stdout, '"$HT_JOB_YAML"')[0].splitlines()


def test_sweep_values_stay_typed_in_the_script(tmp_path):
    # 11. "yes" and "null" swept over a text field reach each array task's job as that text.
    result = cli("render", "--sweep", "train.data.root=yes,null", cwd=tmp_path, env=no_slurm_env(tmp_path))
    assert result.returncode == 0, result.stderr
    points = script_values(result.stdout, '"${HT_POINT_YAMLS[@]}"')
    roots = [ln.strip() for point in points for ln in point.splitlines() if ln.strip().startswith("root: ")]
    assert roots == ["root: 'yes'", "root: 'null'"]


def test_local_sweep_dry_run_shows_what_the_real_submit_runs(tmp_path):
    # 13. the embedded default runs sweeps locally, one run after another; the dry run says so.
    result = cli("submit", "--cluster", "local", "--sweep", "train.seed=0,1", "--dry-run",
                 "--set", "slurm.modules=[cuda]", cwd=tmp_path, env=no_slurm_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("-m hpc_train.train --resolved") == 4  # 2 runs x 2 ranks
    assert "slurm.modules ignored" in result.stderr and "in 2 runs, one after another" in result.stderr
    assert tree(tmp_path) == ["empty-site.yaml"]


def test_srun_missing_beside_sbatch_is_exit_2(tmp_path, stub_slurm):
    # 8. sbatch and squeue on PATH but no srun: submitit cannot submit; say so.
    stub_slurm.remove("srun")
    before = tree(tmp_path)
    result = cli("submit", cwd=tmp_path, env=stub_slurm.env(HOME=str(tmp_path)), timeout=60)
    assert_refused(result, "srun not on PATH")
    assert tree(tmp_path) == before and stub_slurm.calls("sbatch") == []


def _slurm_run(tmp_path, job_id="4242"):
    run_dir = tmp_path / "runs" / "demo" / job_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": job_id, "cluster": "slurm", "logs": {}}))
    return run_dir


def test_failing_slurm_tools_say_their_own_error(tmp_path, stub_slurm):
    # 8. a failing squeue is an error with squeue's words, not "UNKNOWN ... is accounting enabled?"
    _slurm_run(tmp_path)
    env = stub_slurm.env(HOME=str(tmp_path))
    stub_slurm.answer("squeue", stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
                      rc=1)
    assert_refused(cli("status", "demo/4242", cwd=tmp_path, env=env),
                   "squeue failed: slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    # A failing sacct: its own words, as the reason.
    stub_slurm.answer("squeue", stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    stub_slurm.answer("sacct", stderr="Slurm accounting storage is disabled\n", rc=1)
    shown = json.loads(cli("status", "demo/4242", "--json", cwd=tmp_path, env=env).stdout)
    assert shown["state"] == "unknown" and "sacct: Slurm accounting storage is disabled" in shown["reason"]


def test_a_refused_submit_leaves_nothing_behind(tmp_path, stub_slurm):
    # 4. sbatch refuses: no run directory, no submitit pickle or submission file, exit 2 with Slurm's reason.
    stub_slurm.answer("sbatch", stderr="sbatch: error: Batch job submission failed: Invalid account or "
                                       "account/partition combination specified\n", rc=1)
    before = tree(tmp_path)
    result = cli("submit", "--account", "nope", cwd=tmp_path, env=stub_slurm.env(HOME=str(tmp_path)), timeout=60)
    assert_refused(result, "sbatch refused the job: Batch job submission failed: Invalid account")
    assert tree(tmp_path) == before


def test_a_refused_submit_says_sbatchs_reason_once_in_one_line(tmp_path, stub_slurm):
    # sbatch's own stderr (recorded: 22.05 with no configuration, 4 lines) was printed by submitit before
    # hpc-train's line: 5 lines. Now one line, Slurm's reason kept; nothing left behind.
    recorded = Path(__file__).resolve().parents[1] / "slurm_outputs" / "sbatch-no-configuration-22.05"
    stub_slurm.answer("sbatch", stderr=Path(f"{recorded}.stderr").read_text(),
                      rc=int(Path(f"{recorded}.rc").read_text()))
    before = tree(tmp_path)
    result = cli("submit", cwd=tmp_path, env=stub_slurm.env(HOME=str(tmp_path)), timeout=60)
    assert_refused(result, "sbatch refused the job: Could not establish a configuration source (fetch_config: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "sbatch: " not in result.stderr, result.stderr
    assert tree(tmp_path) == before


def test_runs_are_found_wherever_their_job_put_them(tmp_path, stub_slurm):
    # 1. status, logs, cancel and --resume find a run under the job's own runs_dir (the run index).
    (tmp_path / "job.yaml").write_text("name: elsewhere-job\nruns_dir: elsewhere\n")
    env = stub_slurm.env(HOME=str(tmp_path))
    submitted = json.loads(cli("submit", "job.yaml", "--json", cwd=tmp_path, env=env, timeout=60).stdout)
    assert submitted["run_dir"] == str(tmp_path / "elsewhere" / "elsewhere-job" / "4242")
    stub_slurm.answer("squeue", "4242|RUNNING|None|0:10|gpu01\n")
    listed = json.loads(cli("status", "--json", cwd=tmp_path, env=env).stdout)
    assert [(r["run"], r["state"]) for r in listed] == [("elsewhere-job/4242", "running")]
    elsewhere = tmp_path / "other-dir"
    elsewhere.mkdir()
    assert json.loads(cli("status", "elsewhere-job", "--json", cwd=elsewhere, env=env).stdout)["job_id"] == "4242"
    assert cli("logs", "elsewhere-job/4242", cwd=elsewhere, env=env).returncode == 0
    assert "cancelled elsewhere-job/4242" in cli("cancel", "4242", cwd=elsewhere, env=env).stdout
    assert stub_slurm.calls("scancel") == ["4242"]
    stub_slurm.answer("squeue", stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    stub_slurm.answer("sacct", "4242|CANCELLED by 0|0:0|00:00:10|gpu01|None\n")
    resumed = cli("submit", "--resume", "elsewhere-job/4242", "--dry-run", cwd=elsewhere, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"RUN_DIR={tmp_path / 'elsewhere' / 'elsewhere-job' / '4242'}" in resumed.stdout


def test_resume_refuses_a_run_that_still_runs(tmp_path, stub_slurm):
    _slurm_run(tmp_path)
    stub_slurm.answer("squeue", "4242|RUNNING|None|0:10|gpu01\n")
    before = tree(tmp_path)
    result = cli("submit", "--resume", "demo/4242", cwd=tmp_path, env=stub_slurm.env(HOME=str(tmp_path)))
    assert_refused(result, "demo/4242 is running (job 4242); wait for it to end")
    assert tree(tmp_path) == before and stub_slurm.calls("sbatch") == []  # no launch lock file left either


def test_resume_refuses_a_run_whose_state_is_unknown(tmp_path):
    # A Slurm run resumed where no Slurm client answers (here: none on PATH, --cluster local): whether job 4242 still
    # runs cannot be told, and a --resume could start a second trainer beside a live one. Refused as a live run is,
    # saying why and what to do, with nothing written (a dry run: on the old code it planned the launch).
    from hpc_train.config import NO_SITE, dump_yaml, resolve

    run_dir = _slurm_run(tmp_path)
    (run_dir / "job.yaml").write_text(dump_yaml(resolve(None, site=NO_SITE).spec))
    (run_dir / "state.jsonl").write_text('{"event": "running", "writer": "launcher", "instance": "slurm:4242.0", '
                                         '"job_id": "4242", "time": "2026-01-01T00:00:00+00:00"}\n')
    only_python = tmp_path / "bin"
    only_python.mkdir()
    (only_python / "python").symlink_to(sys.executable)
    env = {**no_slurm_env(tmp_path), "PATH": str(only_python)}
    before, state_log = tree(tmp_path), (run_dir / "state.jsonl").read_bytes()
    result = cli("submit", "--cluster", "local", "--resume", "demo/4242", "--dry-run", cwd=tmp_path, env=env)
    assert_refused(result, "demo/4242 is unknown (job 4242): ")
    assert "Slurm" in result.stderr and "hpc-train status demo/4242" in result.stderr
    assert tree(tmp_path) == before and (run_dir / "state.jsonl").read_bytes() == state_log


def test_hpc_train_train_is_the_ranks_entrypoint_and_takes_example_names(tmp_path):
    # 16/19. `hpc-train train` runs `python -m hpc_train.train` (one lifecycle), with shipped example names.
    result = cli("train", "digits_lt_demo", "--set", "train.loss.name=nope", cwd=tmp_path, env=no_slurm_env(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: train.loss.name: must be one of 'ce'")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert tree(tmp_path) == ["empty-site.yaml"]
