"""Writes that fail, fail with their reason (issue 28, item 5): `render -o` onto /dev/full is ENOSPC (it was a
silent replacement of the path by a regular file), and `cancel` in a really read-only runs directory (a read-only
bind mount in a mount namespace of its own: `unshare -rm`, no root needed where user namespaces are on) is exit 2
naming it, with nothing cancelled."""

import os
import shutil
import subprocess
import sys

from tests.unit.hostile.helpers import assert_clean_refusal, invoke, make_run


def test_render_into_dev_full_names_enospc_and_replaces_nothing(tmp_path):
    link = tmp_path / "out.sbatch"
    link.symlink_to("/dev/full")  # never -o /dev/full itself: the old code, as root, would replace the device
    result = invoke("render", "-o", str(link), cwd=tmp_path)
    assert_clean_refusal(result, "No space left on device")
    assert link.is_symlink() and os.readlink(link) == "/dev/full"


def test_cancel_in_a_read_only_runs_directory_names_the_reason_and_cancels_nothing(tmp_path, stub_slurm):
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    assert unshare and mount, "util-linux unshare and mount are needed for the read-only mount"
    run_dir = make_run(tmp_path / "runs", "job", "4242")
    stub_slurm.answer("squeue", "4242|RUNNING|None|gpu01|0:10\n")
    before = (run_dir / "state.jsonl").read_text()
    script = f'{mount} --bind "$1" "$1" && {mount} -o remount,bind,ro "$1" && shift && exec "$@"'
    done = subprocess.run([unshare, "-rm", "sh", "-c", script, "sh", str(tmp_path / "runs"), sys.executable, "-m",
                           "hpc_train.cli", "cancel", "job/4242"], cwd=tmp_path, env=stub_slurm.env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Read-only file system" in done.stderr and "nothing was cancelled" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2
    assert stub_slurm.calls("scancel") == [] and (run_dir / "state.jsonl").read_text() == before


QUEUED_PAGE = '{"event": "queued", "time": "t"' + " " * (4096 - 33) + "}"
"""A state line filling one page exactly: the cancel's line needs a new page (tmpfs allocates by page)."""


def test_cancel_on_a_full_disk_names_enospc(tmp_path, stub_slurm):
    # A real full filesystem: a 64 KiB tmpfs in a mount namespace of its own, filled before the cancel.
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    assert unshare and mount, "util-linux unshare and mount are needed for the tmpfs"
    root = tmp_path / "runs"
    root.mkdir()
    stub_slurm.answer("squeue", "4242|RUNNING|None|gpu01|0:10\n")
    script = (f'{mount} -t tmpfs -o size=64k tmpfs "$1" && cd "$1" && mkdir -p job/4242 && '
              'printf \'{"job_id": "4242", "cluster": "slurm"}\' > job/4242/run.json && '
              f"printf '%s\\n' '{QUEUED_PAGE}' > job/4242/state.jsonl && "
              '(cat /dev/zero > fill 2>/dev/null || true) && shift && exec "$@"')
    done = subprocess.run([unshare, "-rm", "sh", "-c", script, "sh", str(root), sys.executable, "-m", "hpc_train.cli",
                           "cancel", str(root / "job" / "4242")], cwd=tmp_path,
                          env={**stub_slurm.env(), "PATH": stub_slurm.env()["PATH"] + ":/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "No space left on device" in done.stderr and "job 4242 was cancelled (scancel)" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2
