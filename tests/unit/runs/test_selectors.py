"""Selectors never guess (issue 28, item 3): an empty selector (a script's unset "$RUN"), `/`, one made only of
separators or wildcards, or a name that fits runs of several jobs is exit 2 with the candidates, for status, logs,
cancel, report and submit --resume alike; `cancel` acts only on a run named exactly. Slurm is the stand-in on PATH:
no scancel may be called by a refusal."""

import json

import pytest

from hpc_train.runs import index as run_index
from tests.unit.hostile.helpers import assert_clean_refusal, invoke, make_run, snapshot


@pytest.fixture
def runs(tmp_path, on_stub_path):
    """Two local runs of jobA, a Slurm run of jobB (4242) and a sweep (60_0, 60_1) under ./runs, and a second
    jobB/4242 elsewhere, known from the run index."""
    root = tmp_path / "runs"
    make_run(root, "jobA", "local-1", cluster="local", when="2026-01-01T00:00:01+00:00")
    make_run(root, "jobA", "local-2", cluster="local", when="2026-01-01T00:00:02+00:00")
    make_run(root, "jobB", "4242", when="2026-01-02T00:00:00+00:00")
    for point in (0, 1):
        make_run(root, "sw", f"60_{point}", when="2026-01-03T00:00:00+00:00", array_job_id="60")
    other = make_run(tmp_path / "elsewhere", "jobB", "4242", when="2026-01-04T00:00:00+00:00")
    assert run_index.register([other], tmp_path / "other-submit-dir") is None
    on_stub_path.answer("squeue", "")
    return tmp_path


MEANINGLESS = ["", "/", "//", "_*", "*", " ", ".", "./", "?", "/_*", "*_*", "[", "-", "~"]


@pytest.mark.parametrize("selector", MEANINGLESS)
@pytest.mark.parametrize("command", [["cancel"], ["status"], ["logs"], ["report"], ["submit", "--resume"]])
def test_a_selector_that_names_nothing_is_refused_and_changes_nothing(runs, on_stub_path, command, selector):
    # Before: cancel '' / cancel '/' / cancel '_*' cancelled the latest run, status '' listed every run, and
    # submit --resume '' submitted the default job.
    before = snapshot(runs)
    result = invoke(*command, selector, cwd=runs)
    assert_clean_refusal(result, "names no run")
    assert snapshot(runs) == before
    assert on_stub_path.calls("scancel") == [] and on_stub_path.calls("sbatch") == []


@pytest.mark.parametrize("command", [["cancel"], ["status"], ["logs"], ["report"], ["submit", "--resume"]])
def test_a_name_that_fits_runs_of_two_jobs_lists_them_and_picks_none(runs, on_stub_path, command):
    before = snapshot(runs)
    for selector in ("4242", "jobB/4242"):
        result = invoke(*command, selector, cwd=runs)
        assert_clean_refusal(result, "fits runs of 2 jobs")
        assert str(runs / "runs" / "jobB" / "4242") in result.stderr
        assert str(runs / "elsewhere" / "jobB" / "4242") in result.stderr
    assert snapshot(runs) == before and on_stub_path.calls("scancel") == []


def test_report_none_is_no_id_of_runs_without_an_array(runs):
    # Before: str(None) was an id of every run without an array, so `report None` reported them all.
    assert_clean_refusal(invoke("report", "None", cwd=runs), "no runs for 'None'")


def test_cancel_by_job_name_acts_on_its_latest_run_only(runs, on_stub_path):
    result = invoke("cancel", "jobA", cwd=runs)
    assert result.exit_code == 0 and "cancelled jobA/local-2" in result.stdout
    events = [json.loads(line)["event"] for line in (runs / "runs/jobA/local-2/state.jsonl").read_text().splitlines()]
    assert events == ["queued", "cancelled"]
    assert (runs / "runs/jobA/local-1/state.jsonl").read_text().count("\n") == 1
    # An exact run directory is exact even where its name is ambiguous.
    assert invoke("status", str(runs / "elsewhere/jobB/4242"), cwd=runs).exit_code == 0
    assert on_stub_path.calls("scancel") == []
