"""The run index (hpc_train.runs.index): runs of job files with their own runs_dir are found by name, and
the index drops the runs whose directory is gone once it has grown large, keeping every live one."""

import json
from pathlib import Path

from hpc_train.runs import index as run_index


def make_run(root: Path, name: str) -> Path:
    run_dir = root / "group" / name
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": name}))
    return run_dir


def indexed_dirs() -> list[str]:
    return [json.loads(line)["run_dir"] for line in run_index.index_path().read_text().splitlines()]


def test_a_run_elsewhere_is_found_by_name_and_id(tmp_path):
    run_dir = make_run(tmp_path / "elsewhere", "41")
    assert run_index.register([run_dir], tmp_path) is None
    assert run_index.resolve_run("group/41", tmp_path / "runs").run_dir == run_dir
    assert run_index.resolve_run("41", tmp_path / "runs").run_dir == run_dir


def test_a_large_index_drops_the_runs_that_are_gone_and_keeps_the_others(tmp_path):
    live = [make_run(tmp_path, f"live-{i}") for i in range(3)]
    gone = [tmp_path / "group" / f"gone-{i}" for i in range(40)]
    run_index.register(gone[:20] + live[:2] + gone[20:], tmp_path)
    size = run_index.index_path().stat().st_size
    # Below the threshold nothing is dropped...
    run_index.register([live[2]], tmp_path, prune_at_bytes=size * 2)
    assert len(indexed_dirs()) == 43
    # ...above it, the runs that are gone are, in one rewrite, and the new line is kept.
    newest = make_run(tmp_path, "newest")
    run_index.register([newest], tmp_path, prune_at_bytes=size)
    assert indexed_dirs() == [str(d) for d in (*live, newest)]
    assert not list(run_index.index_path().parent.glob(".runs.jsonl.*"))  # no temporary file left behind
