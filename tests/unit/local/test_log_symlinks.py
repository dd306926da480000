"""A resumed local run appends to its logs (issue 28 item 4): a rank log or the batch log planted as a symlink in a
shared run directory is refused, never written through. Real symlinks, the real local launcher's log opening."""

from __future__ import annotations

import pytest

from hpc_train.local import launcher
from hpc_train.runs import rundir, safe_files


def test_a_symlinked_rank_log_is_not_written_through(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (run_dir / rundir.RANK_LOG.format(rank=0)).symlink_to(victim)
    launch = launcher.Launch(run_dir=str(run_dir), run_id="r", world_size=1, visible_gpus=0, time_limit_s=0,
                             signal="USR2", signal_delay_s=0, env={})
    with pytest.raises(safe_files.RunFileError):
        launcher._start_ranks(launch, "/bin/true", str(tmp_path), 29500, "i")
    assert victim.read_text() == "precious\n"

