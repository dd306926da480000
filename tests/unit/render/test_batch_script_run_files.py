"""The batch script's own writes in a run directory never follow what a neighbour planted there (issue 28, item 4):
a continued run (``submit --resume``) whose ``state.jsonl``, ``job.yaml``, ``logs/`` or a rank's log is a symlink,
or whose state log is a FIFO. The rendered script is run by bash itself (its ``>``/``>>`` are what followed links),
with stand-ins for srun and scontrol: the shell's own opens are what is tested, and they are the same under
slurmd. What a stand-in cannot show: slurmstepd's own open of ``--output`` (refused here before srun runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.config import NO_SITE, resolve_job
from hpc_train.render import LaunchSpec, render_sbatch
from hpc_train.runs import rundir

SRUN = """#!/bin/bash
echo called >> "$STUB_CALLS"
exit 0
"""


def run_script(tmp_path: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """The script of a continuation of ``run_dir`` (job 4242), run by bash; srun and scontrol are stand-ins."""
    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.python=" + sys.executable])
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec, runs_root=str(tmp_path / "runs"), python=sys.executable,
                                    launch=LaunchSpec(run_dir=str(run_dir))))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool, text in (("srun", SRUN), ("scontrol", "#!/bin/bash\nexit 1\n")):
        (bin_dir / tool).write_text(text)
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "node01", "SLURM_CPUS_PER_TASK": "1", "STUB_CALLS": str(tmp_path / "srun-calls")}
    return subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.fixture
def continued(tmp_path):
    """A run directory as an earlier launch left it, and a file outside it that must stay as it is."""
    run_dir = tmp_path / "runs" / "demo" / "4241"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "state.jsonl").write_text(json.dumps({"event": "queued", "writer": "submit"}) + "\n")
    (run_dir / "job.yaml").write_text("name: demo\n")
    (tmp_path / "victim.txt").write_text("precious\n")
    return run_dir


def _srun_called(tmp_path):
    return (tmp_path / "srun-calls").exists()


def test_a_symlink_planted_as_the_state_log_is_not_appended_through(tmp_path, continued):
    (continued / "state.jsonl").unlink()
    (continued / "state.jsonl").symlink_to(tmp_path / "victim.txt")
    result = run_script(tmp_path, continued)
    assert (tmp_path / "victim.txt").read_text() == "precious\n"
    assert result.returncode == 2 and "cannot append to" in result.stderr, result.stdout + result.stderr
    assert not _srun_called(tmp_path)


def test_a_fifo_planted_as_the_state_log_is_refused_not_waited_on(tmp_path, continued):
    (continued / "state.jsonl").unlink()
    os.mkfifo(continued / "state.jsonl")
    result = run_script(tmp_path, continued)  # the old script blocked here (until the 60 s deadline)
    assert result.returncode == 2 and "cannot append to" in result.stderr, result.stdout + result.stderr
    assert not _srun_called(tmp_path)


def test_a_symlink_planted_as_job_yaml_is_replaced_never_written_through(tmp_path, continued):
    (continued / "job.yaml").unlink()
    (continued / "job.yaml").symlink_to(tmp_path / "victim.txt")
    result = run_script(tmp_path, continued)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "victim.txt").read_text() == "precious\n"
    assert not (continued / "job.yaml").is_symlink() and "name:" in (continued / "job.yaml").read_text()
    assert [e["event"] for e in rundir.read_events(continued)] == ["queued", "running", "exit"]
    assert not list(continued.glob("job.yaml.*"))  # no temporary file left


@pytest.mark.parametrize("planted", ["logs", "logs/rank-0.log"])
def test_a_symlinked_logs_directory_or_rank_log_is_refused_before_srun(tmp_path, continued, planted):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "logs":
        (continued / "logs").rmdir()
        (continued / "logs").symlink_to(elsewhere)
    else:
        (continued / planted).symlink_to(tmp_path / "victim.txt")
    result = run_script(tmp_path, continued)
    assert result.returncode == 2 and "refusing to write" in result.stderr, result.stdout + result.stderr
    assert not _srun_called(tmp_path)  # srun's --output would have followed it
    assert list(elsewhere.iterdir()) == [] and (tmp_path / "victim.txt").read_text() == "precious\n"
