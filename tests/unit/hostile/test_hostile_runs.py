"""The hostile-input suite (issue 28): what a careless script or a hostile neighbour in a shared runs directory
hands hpc-train, case by case. Every case is a clean refusal (exit 2, one or two lines, no traceback) or inert
(exit 0, the runs directory as it was, the hostile run shown as `unknown` with its reason); never a traceback, a
hang (each case has a deadline), a write through a planted link, or a Slurm tool called (the stand-ins record every
call). Cases run in this process (click's runner), so hundreds take seconds."""

from __future__ import annotations

import json
import os

import pytest

from tests.unit.hostile.helpers import assert_clean_refusal, invoke, make_run, snapshot

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def shared(tmp_path, on_stub_path):
    """A runs directory shared with others: a local run, a Slurm run and a two-point sweep."""
    root = tmp_path / "runs"
    make_run(root, "mine", "local-1", cluster="local", when="2026-01-01T00:00:01+00:00")
    make_run(root, "theirs", "4242", when="2026-01-02T00:00:00+00:00")
    for point in (0, 1):
        make_run(root, "sw", f"60_{point}", when="2026-01-03T00:00:00+00:00", array_job_id="60")
    on_stub_path.answer("squeue", "4242|RUNNING|None|gpu01|0:10\n")
    (tmp_path / "victim.txt").write_text("precious\n")
    return tmp_path


def _assert_untouched(shared, before, stub):
    assert snapshot(shared) == before
    assert (shared / "victim.txt").read_text() == "precious\n"
    assert stub.calls("scancel") == [] and stub.calls("sbatch") == []


# 1. Selectors that name no run, or none that exists ------------------------------------------------------------
SELECTORS = ["\t", "\n", "//", "///", "_", "__", "*/*", "?", "[]", "[!a]", "{}", "~", "$", "^", "!", "- ", "._",
             "/./", "*/4242", "mine/*", "mine/local-*", "../..", "runs/../..", "/etc", "/dev/null", "/proc/self",
             "/", "..", "nope", "4242_", "4242_*", "60_", "60_99", "sw/60_99", "theirs/42", "42", "None", "null",
             "x" * 5000, "mine\x00", "mine/../theirs", "%s", "{rank}", "${HOME}", "$(id)", "`id`", "ünïcödé"]


@pytest.mark.parametrize("selector", SELECTORS, ids=[repr(s)[:30] for s in SELECTORS])
@pytest.mark.parametrize("command", ["cancel", "status", "logs"])
def test_a_selector_that_names_no_run_is_a_clean_refusal(shared, on_stub_path, command, selector):
    before = snapshot(shared)
    result = invoke(command, selector, cwd=shared)
    assert_clean_refusal(result)
    _assert_untouched(shared, before, on_stub_path)


# 2. Files a neighbour planted in a run directory ---------------------------------------------------------------
PLANTED = ["run.json", "state.jsonl", "metrics.jsonl", "config.json", "logs/batch.log", "ranks/progress-0.json",
           "excluded_nodes.json", "class_counts.json"]
KINDS = ["fifo", "symlink-to-victim", "symlink-to-dev-zero", "directory"]


def _plant(run_dir, name, kind, victim):
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-to-victim":
        path.symlink_to(victim)
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_file_blocks_nobody_and_is_written_through_by_nobody(shared, on_stub_path, name, kind):
    run_dir = shared / "runs" / "theirs" / "4242"
    if name == "logs/batch.log":
        record = json.loads((run_dir / "run.json").read_text())
        (run_dir / "run.json").write_text(json.dumps({**record, "logs": {"batch": str(run_dir / name)}}))
    _plant(run_dir, name, kind, shared / "victim.txt")
    before = snapshot(shared)
    listing = invoke("status", "--json", cwd=shared)  # everyone's plain status
    assert listing.exit_code == 0, listing.output
    rows = {r["run"]: r for r in json.loads(listing.stdout)}
    assert rows["mine/local-1"]["state"] == "queued" and len(rows) == 4
    for command in (["status", "theirs/4242"], ["logs", "theirs/4242"], ["report", "theirs"],
                    ["cancel", "theirs/4242"]):
        result = invoke(*command, cwd=shared)
        if result.exit_code != 0:
            assert_clean_refusal(result)
        if command[0] != "cancel" or result.exit_code != 0:
            assert snapshot(shared) == before, command
    assert (shared / "victim.txt").read_text() == "precious\n"


# 3. run.json values of the wrong type --------------------------------------------------------------------------
WRONG = [("job_id", [1]), ("job_id", {"a": 1}), ("job_id", True), ("job_id", 1.5), ("cluster", 7), ("cluster", None),
         ("cluster", ["local"]), ("world_size", "2"), ("world_size", 2.0), ("world_size", -1), ("world_size", True),
         ("logs", "x"), ("logs", ["x"]), ("logs", {"batch": 5}), ("logs", {"rank_out": ["x"]}), ("launcher_pid", "1"),
         ("launcher_pid", -5), ("submitted_at", 5), ("submitted_at", {}), ("array_job_ids", "60"),
         ("array_job_ids", [None]), ("array_job_id", []), ("sweep_id", {}), ("pack", "2"), ("ranks_per_node", "2"),
         ("ranks_per_node", [2]), ("launcher", 5)]


@pytest.mark.parametrize("key, value", WRONG, ids=[f"{k}={v!r}" for k, v in WRONG])
def test_a_run_record_of_wrong_types_is_that_run_unknown_or_refused(shared, on_stub_path, key, value):
    run_dir = shared / "runs" / "theirs" / "4242"
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, key: value}))
    before = snapshot(shared)
    listing = invoke("status", "--json", cwd=shared)
    assert listing.exit_code == 0, listing.output
    rows = {r["run"]: r for r in json.loads(listing.stdout)}
    assert rows["mine/local-1"]["state"] == "queued"
    for command in (["status", "theirs/4242"], ["logs", "theirs/4242"], ["cancel", "theirs/4242"],
                    ["report", "theirs"]):
        result = invoke(*command, cwd=shared)
        assert result.exit_code in (0, 2), (command, result.output, result.exception)
        if result.exit_code == 2:
            assert_clean_refusal(result)
    if rows["theirs/4242"]["state"] == "unknown":  # it cannot be told what job it is: never cancelled
        assert snapshot(shared) == before and on_stub_path.calls("scancel") == []


# 4. State and metrics lines of the wrong type ------------------------------------------------------------------
LINES = [("state.jsonl", {"event": "exit", "exit_code": "1"}), ("state.jsonl", {"event": "exit", "exit_code": None}),
         ("state.jsonl", {"event": "exit", "exit_code": 1.5}), ("state.jsonl", {"event": "exit", "exit_code": True}),
         ("state.jsonl", {"event": "running", "restart": []}), ("state.jsonl", {"event": "running", "instance": {}}),
         ("state.jsonl", {"event": "failed", "reason": 5}), ("state.jsonl", {"event": "completed", "epoch": "3"}),
         ("state.jsonl", {"event": "running", "time": 5}), ("state.jsonl", {"event": 5}), ("state.jsonl", [1, 2]),
         ("state.jsonl", "x"), ("state.jsonl", {"event": "failed", "rank": [1]}),
         ("state.jsonl", {"event": "failed", "first_rank": [1]}), ("state.jsonl", {"event": "requeued", "note": 5}), ("metrics.jsonl", {"epoch": 1, "top1": "0.5"}), ("metrics.jsonl", {"epoch": 1, "few": []}),
         ("metrics.jsonl", {"epoch": [], "top1": 0.5}), ("metrics.jsonl", {"phase": "main", "epoch": 1, "top1": {}}),
         ("metrics.jsonl", {"phase": "main", "epoch": 1, "val": "x"}),
         ("metrics.jsonl", {"phase": "main", "epoch": 1, "val": {"balanced": "x"}}),
         ("metrics.jsonl", {"record": "rank_compute", "stragglers": "x"}),
         ("metrics.jsonl", {"record": "rank_compute", "stragglers": [{"rank": "0"}]}),
         ("metrics.jsonl", [1]), ("metrics.jsonl", 5)]


@pytest.mark.parametrize("name, line", LINES, ids=[f"{n}:{json.dumps(v)[:40]}" for n, v in LINES])
def test_a_line_of_wrong_types_is_that_run_unknown_never_a_traceback(shared, on_stub_path, name, line):
    run_dir = shared / "runs" / "mine" / "local-1"
    with open(run_dir / name, "a") as handle:
        handle.write(json.dumps(line) + "\n")
    before = snapshot(shared)
    listing = invoke("status", "--json", cwd=shared)
    assert listing.exit_code == 0, (listing.output, listing.exception)
    assert len(json.loads(listing.stdout)) == 4
    for command in (["status", "mine/local-1"], ["report", "mine"], ["logs", "mine/local-1"]):
        result = invoke(*command, cwd=shared)
        assert result.exit_code in (0, 2), (command, result.output, result.exception)
        if result.exit_code == 2:
            assert_clean_refusal(result)
    assert snapshot(shared) == before


# 5. Run directories named as paths: `.` inside a run directory, `../RUN`; `.` and `..` that are none ------------
RUN_PATHS = [("runs/mine/local-1", "."), ("runs/mine/local-1", "./"), ("runs/mine/local-1", "../local-1"),
             ("runs/mine", "./local-1"), ("runs/theirs", "../mine/local-1")]


@pytest.mark.parametrize("where, selector", RUN_PATHS, ids=[f"{w}:{s}" for w, s in RUN_PATHS])
@pytest.mark.parametrize("command", ["status", "logs", "report"])
def test_a_run_directory_given_as_a_path_names_that_run(shared, on_stub_path, command, where, selector):
    # --help: "a run directory" is a RUN. Before: `.` was refused as made only of separators.
    before = snapshot(shared)
    result = invoke(command, selector, *(["--json"] if command == "status" else []), cwd=shared / where)
    assert result.exit_code == 0, (result.output, result.exception)
    if command == "status":
        assert json.loads(result.stdout)["run_dir"] == str(shared / "runs/mine/local-1")
    _assert_untouched(shared, before, on_stub_path)


def test_cancel_of_dot_inside_a_run_directory_cancels_that_run_only(shared, on_stub_path):
    result = invoke("cancel", ".", cwd=shared / "runs/mine/local-1")
    assert result.exit_code == 0 and "cancelled mine/local-1" in result.stdout, (result.output, result.exception)
    assert '"cancelled"' in (shared / "runs/mine/local-1/state.jsonl").read_text()
    assert on_stub_path.calls("scancel") == [] and "cancelled" not in (shared / "runs/theirs/4242/state.jsonl").read_text()


NOT_RUN_PATHS = [("runs/mine/local-1", ".."), ("runs/mine/local-1", "../"), ("runs/mine", "."), ("runs", "."),
                 ("", "."), ("runs/mine/local-1", "../..")]


@pytest.mark.parametrize("where, selector", NOT_RUN_PATHS, ids=[f"{w or 'top'}:{s}" for w, s in NOT_RUN_PATHS])
@pytest.mark.parametrize("command", ["cancel", "status", "logs"])
def test_dot_or_dot_dot_that_is_no_run_directory_is_refused_naming_where_it_points(shared, on_stub_path, command,
                                                                                   where, selector):
    before = snapshot(shared)
    result = invoke(command, selector, cwd=shared / where)
    assert_clean_refusal(result, f"names no run: {selector} is {(shared / where / selector).resolve()}, not a run "
                                 "directory")
    _assert_untouched(shared, before, on_stub_path)


def test_report_of_dot_dot_inside_a_run_directory_is_its_jobs_runs(shared):
    # report takes a job's directory of runs (all its runs), as a path like any other.
    result = invoke("report", "..", "--json", cwd=shared / "runs/sw/60_0")
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["runs"] == 2
