"""Slurm's output, parsed: squeue and sacct lines, the first failing rank in a batch log, a failing tool's
own message, and the log files of a run (array tasks included). The texts in tests/slurm_outputs/ were
recorded from the Slurm 22.05 test cluster (see its README); no Slurm and no root are needed here: the
tools are stand-ins on PATH that print those texts, as submitit's tests fake sbatch/sacct."""

from pathlib import Path

import pytest

from hpc_train.errors import SubmitError
from hpc_train.runs.index import Run
from hpc_train.runs.status import first_failure, first_failure_in, log_files
from hpc_train.slurm import client as slurm

OUT = Path(__file__).resolve().parents[2] / "slurm_outputs"


def text(name):
    return (OUT / name).read_text()


@pytest.mark.parametrize("job_id,state,reason,nodes", [
    ("38", "RUNNING", "", "gpu01"),
    ("39_0", "RUNNING", "", "gpu01"),
    ("39_2", "PENDING", "JobArrayTaskLimit", ""),  # inside the pending range 39_[1-3%1]
    ("39_3", "PENDING", "JobArrayTaskLimit", ""),
])
def test_squeue_lines(job_id, state, reason, nodes):
    found = slurm.parse_squeue(text("squeue-mixed.txt"), job_id)
    assert (found.state, found.reason, found.nodes, found.source) == (state, reason, nodes, "squeue")


@pytest.mark.parametrize("job_id", ["36", "39_4", "39", "3"])
def test_squeue_knows_only_queued_jobs(job_id):
    assert slurm.parse_squeue(text("squeue-mixed.txt"), job_id) is None


def test_squeue_of_one_pending_array_task():
    assert slurm.parse_squeue(text("squeue-array-pending-task.txt"), "39_2").state == "PENDING"


@pytest.mark.parametrize("job_id,state,exit_code,nodes", [
    ("36", "COMPLETED", "0:0", "gpu01"),
    ("37", "FAILED", "15:0", "gpu[01-02]"),
    ("38", "CANCELLED", "0:0", "gpu01"),  # "CANCELLED by 0"
    ("39_0", "CANCELLED", "0:0", "gpu01"),
])
def test_sacct_lines(job_id, state, exit_code, nodes):
    found = slurm.parse_sacct(text("sacct-mixed.txt"), job_id)
    assert (found.state, found.exit_code, found.nodes, found.source) == (state, exit_code, nodes, "sacct")
    assert not found.active


@pytest.mark.parametrize("job_id", ["39_1", "39_2", "39_3"])
def test_sacct_reads_a_pending_cancelled_range_as_squeue_does_without_its_placeholder_node_list(job_id):
    # sacct-mixed.txt: 39_[1-3%1]|CANCELLED by 0|0:0|00:00:00|None assigned|JobArrayTaskLimit (issue 26)
    found = slurm.parse_sacct(text("sacct-mixed.txt"), job_id)
    assert (found.state, found.nodes, found.reason, found.source) == ("CANCELLED", "", "JobArrayTaskLimit", "sacct")
    assert slurm.parse_sacct(text("sacct-mixed.txt"), "39_4") is None


def test_a_timed_out_job_is_failed_with_the_reason_slurm_gives():
    from hpc_train.runs import rundir
    from hpc_train.runs.status import reconcile

    found = slurm.parse_sacct(text("sacct-timeout.txt"), "41")
    assert (found.state, found.exit_code) == ("TIMEOUT", "0:0")
    assert reconcile(rundir.RunState(state="running"), found) == ("failed", "time limit reached (Slurm: TIMEOUT 0:0)")


def test_first_failing_rank_is_named_not_the_ranks_killed_after_it():
    assert first_failure_in(text("batch-log-rank-3-failed.txt")) == "rank 3 on gpu02: Exited with exit code 7"
    # The local launcher writes the same line for local runs.
    assert first_failure_in("12:00:01 hpc-train: error: vm: task 1: Exited with exit code 2\n") == \
        "rank 1 on vm: Exited with exit code 2"
    assert first_failure_in("srun: error: gpu01: tasks 0-1: Terminated\n") is None


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """Stand-in squeue/sacct on PATH: each prints a recorded text and exits with a recorded code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))

    def tool(name, stdout="", stderr="", code=0):
        (bin_dir / name).write_text(f"#!/bin/sh\n/bin/cat {OUT / stdout if stdout else '/dev/null'}\n"
                                    f"/bin/cat {OUT / stderr if stderr else '/dev/null'} >&2\nexit {code}\n")
        (bin_dir / name).chmod(0o755)
    return tool


def test_job_state_asks_squeue_then_sacct(stand_in):
    stand_in("squeue", stdout="squeue-mixed.txt")
    stand_in("sacct", stdout="sacct-mixed.txt")
    assert slurm.job_state("38").state == "RUNNING"
    assert (slurm.job_state("37").state, slurm.job_state("37").source) == ("FAILED", "sacct")


def test_a_finished_job_is_an_invalid_id_to_squeue_and_found_in_sacct(stand_in):
    stand_in("squeue", stderr="squeue-invalid-job-id.stderr", code=1)
    stand_in("sacct", stdout="sacct-mixed.txt")
    assert slurm.job_state("36").state == "COMPLETED"


def test_a_failing_squeue_says_its_own_error(stand_in):
    stand_in("squeue", stderr="squeue-controller-down.stderr", code=1)
    stand_in("sacct", stdout="sacct-mixed.txt")
    with pytest.raises(SubmitError, match=r"^squeue failed: slurm_load_jobs error: Unable to contact slurm "
                                          r"controller \(connect failure\)$"):
        slurm.job_state("36")


def test_a_failing_sacct_says_its_own_error(stand_in):
    stand_in("squeue", stderr="squeue-invalid-job-id.stderr", code=1)
    stand_in("sacct", stderr="sacct-accounting-disabled.stderr", code=1)
    found = slurm.job_state("36")
    assert (found.state, found.reason) == ("UNKNOWN", "not in squeue; sacct: Slurm accounting storage is disabled")


def test_slurms_reason_is_one_line_without_the_noise():
    # Recorded: sbatch 22.05 with no configuration to find (4 lines, the fatal one last), squeue with the
    # controller down; the harness's sbatch (22.05) for a partition that does not exist and for too much memory.
    assert slurm.slurm_message(text("sbatch-no-configuration-22.05.stderr")) == (
        "Could not establish a configuration source (fetch_config: DNS SRV lookup failed; _establish_config_source: "
        "failed to fetch config)")
    assert slurm.slurm_message(text("squeue-controller-down.stderr")) == (
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    assert slurm.slurm_message(text("sbatch-invalid-partition-22.05.stderr")) == (
        "Batch job submission failed: Invalid partition name specified (invalid partition specified: nope)")
    assert slurm.slurm_message(text("sbatch-too-much-memory-22.05.stderr")) == (
        "Batch job submission failed: Requested node configuration is not available (Memory specification can not "
        "be satisfied)")


def test_missing_tools_are_named(stand_in):
    stand_in("sbatch")
    stand_in("squeue")
    assert slurm.missing_tools() == ["srun", "scancel"]


def test_log_files_of_an_array_task_in_submitit_form(tmp_path):
    folder = tmp_path / "runs" / "sweep" / ".submitit"
    logs = {"batch": str(folder / "39_1_0_log.err"), "rank_out": str(folder / "39_1_{rank}_log.out"),
            "rank_err": str(folder / "39_1_{rank}_log.err")}
    run = Run(tmp_path / "runs" / "sweep" / "39_1", {"job_id": "39_1", "world_size": 2, "logs": logs})
    assert [(label, p.name) for label, p in log_files(run)] == [
        ("batch", "39_1_0_log.err"), ("rank 0", "39_1_0_log.out"), ("rank 1", "39_1_1_log.err"),
        ("rank 1", "39_1_1_log.out")]
    assert [p.name for _, p in log_files(run, rank=1)] == ["39_1_1_log.err", "39_1_1_log.out"]
    folder.mkdir(parents=True)
    (folder / "39_1_0_log.out").write_text(text("batch-log-rank-3-failed.txt"))  # the .err's .out twin
    assert first_failure(run) == "rank 3 on gpu02: Exited with exit code 7"


def test_log_files_of_a_plain_sbatch_run(tmp_path):
    run_dir = tmp_path / "plain" / "4242"
    (run_dir / "logs").mkdir(parents=True)
    for name in ("batch.log", "rank-0.log", "rank-2.log", "rank-10.log", "rank-x.log"):
        (run_dir / "logs" / name).write_text("")
    run = Run(run_dir, {"job_id": "4242", "logs": {"batch": str(run_dir / "logs/batch.log"),
                                                    "rank_out": str(run_dir / "logs/rank-{rank}.log")}})
    assert [(label, p.name) for label, p in log_files(run)] == [
        ("batch", "batch.log"), ("rank 0", "rank-0.log"), ("rank 2", "rank-2.log"), ("rank 10", "rank-10.log")]


def test_logs_rank_counts_ranks_under_torchrun(tmp_path):
    # Two nodes of 2 ranks: submitit's task logs are the nodes' (one torchrun each), rank 3 is in node 1's.
    folder = tmp_path / "runs" / "tr" / ".submitit"
    logs = {"batch": str(folder / "50_0_log.err"), "rank_out": str(folder / "50_{rank}_log.out"),
            "rank_err": str(folder / "50_{rank}_log.err")}
    run = Run(tmp_path / "runs" / "tr" / "50", {"job_id": "50", "world_size": 4, "ranks_per_node": 2, "nodes": 2,
                                                "launcher": "torchrun", "logs": logs})
    assert [(label, p.name) for label, p in log_files(run, rank=3)] == [
        ("node 1, ranks 2-3", "50_1_log.err"), ("node 1, ranks 2-3", "50_1_log.out")]
    assert [(label, p.name) for label, p in log_files(run)] == [
        ("batch", "50_0_log.err"), ("node 0, ranks 0-1", "50_0_log.out"), ("node 1, ranks 2-3", "50_1_log.err"),
        ("node 1, ranks 2-3", "50_1_log.out")]
    local = Run(tmp_path / "runs" / "tr" / "l1", {"job_id": "l1", "world_size": 2, "ranks_per_node": 2,
                                                  "launcher": "torchrun", "cluster": "local",
                                                  "logs": {"rank_out": str(tmp_path / "runs" / "tr" / "l1" / "r{rank}.log")}})
    assert [(label, p.name) for label, p in log_files(local, rank=1)] == [("rank 1", "r1.log")]  # one log per rank


# sacct's forms of arrays, recorded from the 22.05 harness by tests/slurm_outputs/record_arrays.py (issue 26) -----

@pytest.mark.parametrize("job_id", ["3_0", "3_1"])
def test_an_array_just_ended_is_read_from_its_bare_id_record(job_id):
    found = slurm.parse_sacct(text("sacct-array-ended-first.txt"), job_id)  # 3|FAILED|3:0|...
    assert (found.state, found.exit_code, found.nodes, found.source) == ("FAILED", "3:0", "gpu01", "sacct")
    assert slurm.parse_sacct(text("sacct-array-ended.txt"), job_id).state == "FAILED"  # later: 3_0|..., 3_1|...


@pytest.mark.parametrize("job_id", ["2_0", "2_1", "2_2"])
def test_an_array_cancelled_while_pending_is_one_range_record(job_id):
    found = slurm.parse_sacct(text("sacct-array-cancelled-pending.txt"), job_id)  # 2_[0-2%2]|CANCELLED by 0|...
    assert (found.state, found.nodes, found.reason) == ("CANCELLED", "", "")


def test_a_job_cancelled_before_it_started_has_no_node_list_not_sacct_placeholder():
    found = slurm.parse_sacct(text("sacct-cancelled-before-start.txt"), "1")
    assert (found.state, found.nodes) == ("CANCELLED", "")


@pytest.mark.parametrize("by_tasks,by_array,ids,want", [
    ("sacct-array-ended-first-tasks.txt", "sacct-array-ended-first.txt", ["3_0", "3_1"], "FAILED"),
    ("sacct-array-cancelled-pending-tasks.txt", "sacct-array-cancelled-pending.txt", ["2_0", "2_1", "2_2"],
     "CANCELLED"),
])
def test_status_asks_sacct_by_the_array_id_too(stand_in, tmp_path, by_tasks, by_array, ids, want):
    """Asked by task ids only, sacct prints nothing for these arrays (recorded: the *-tasks.txt files are empty); the
    stand-in answers as the harness's sacct did, by whether the array id is among the ids asked."""
    stand_in("squeue", stderr="squeue-invalid-job-id.stderr", code=1)
    array = ids[0].split("_")[0]
    (tmp_path / "bin" / "sacct").write_text(
        f'#!/bin/sh\nfor arg in "$@"; do case ",$arg," in *,{array},*) /bin/cat {OUT / by_array}; exit 0;; esac; done\n'
        f"/bin/cat {OUT / by_tasks}\n")
    (tmp_path / "bin" / "sacct").chmod(0o755)
    states = slurm.job_states(ids)
    assert {j: (s.state, s.source) for j, s in states.items()} == {j: (want, "sacct") for j in ids}
    assert all(s.nodes != "None assigned" for s in states.values()), states


# The same forms recorded on each Slurm version of the harness (tests/cluster/record-outputs, issue 26) ----------

VERSIONS = ["22.05", "24.11", "26.05"]


@pytest.mark.parametrize("version", VERSIONS)
def test_each_versions_array_and_cancelled_records_are_read(version):
    ended = text(f"sacct-array-ended-{version}.txt")
    assert [(j, slurm.parse_sacct(ended, j).state) for j in ("2_0", "2_1", "2_2")] == [
        ("2_0", "COMPLETED"), ("2_1", "FAILED"), ("2_2", "COMPLETED")]
    pending = text(f"sacct-array-cancelled-pending-{version}.txt")  # one 5_[0-2%2] record for all three
    assert [(slurm.parse_sacct(pending, f"5_{i}").state, slurm.parse_sacct(pending, f"5_{i}").nodes)
            for i in range(3)] == [("CANCELLED", "")] * 3
    single = slurm.parse_sacct(text(f"sacct-cancelled-before-start-{version}.txt"), "6")
    assert (single.state, single.nodes) == ("CANCELLED", "")  # not sacct's "None assigned"
    held = text(f"squeue-array-held-{version}.txt")
    assert [slurm.parse_squeue(held, f"5_{i}").state for i in range(3)] == ["PENDING"] * 3
