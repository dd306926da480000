"""A full disk at a checkpoint (issue 28, item 5), on a real full filesystem: a small tmpfs mounted over the run's
checkpoints/ in a mount namespace of its own (``unshare -m``: nothing leaks to the machine; needs root or user
namespaces, asserted, never skipped).

Two launches of ``python -m hpc_train.train`` in one namespace: the first writes epoch 1's checkpoint on a roomy
tmpfs; the tmpfs is then shrunk to 1.5 times that checkpoint (room for it, not for a second beside it: every write
goes to a temporary file first), and the second launch resumes, trains epoch 2 and cannot write its checkpoint.
It must fail naming ENOSPC and the file, leave epoch 1's checkpoint intact and alone in the directory, and record
``failed`` with that reason; a resume after it continues from epoch 1's checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from hpc_train.runs import rundir  # noqa: E402
from hpc_train.train.state import checkpoint as ckpt  # noqa: E402

JOB = """name: full-disk
train:
  device: cpu
  epochs: 2
  batch_size: 32
  model: {name: small_cnn}
  data: {name: synthetic-lt, num_classes: 4, max_per_class: 16, test_per_class: 2, image_size: 8}
"""

SCRIPT = r"""set -e
mkdir -p "$RUN/checkpoints"
mount -t tmpfs -o size=16m tmpfs "$RUN/checkpoints"
"$PY" -m hpc_train.train "$JOB" --run-dir "$RUN" --set train.epochs=1 > "$RUN/first.log" 2>&1
size=$(stat -c %s "$RUN"/checkpoints/ckpt-*.pt)
mount -o remount,size=$(( (size * 3 / 2 / 4096 + 1) * 4096 )) tmpfs "$RUN/checkpoints"
set +e
"$PY" -m hpc_train.train "$JOB" --run-dir "$RUN" > "$RUN/second.log" 2>&1
echo "second exit $?"
mkdir "$RUN/after" && cp -a "$RUN/checkpoints" "$RUN/after/"  # the tmpfs goes with the namespace: what it held, for the checks
"""


def test_a_full_disk_at_a_checkpoint_fails_naming_enospc_and_keeps_the_previous_one(tmp_path, isolated_launch_env):
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    assert unshare and mount, "util-linux unshare and mount are needed for the tmpfs"
    job, run = tmp_path / "job.yaml", tmp_path / "run"
    job.write_text(JOB)
    done = subprocess.run([unshare, "-rm", "--propagation", "private", "bash", "-c", SCRIPT],
                          env={**os.environ, "RUN": str(run), "JOB": str(job), "PY": sys.executable},
                          capture_output=True, text=True, timeout=240)
    first = (run / "first.log").read_text() if (run / "first.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + first
    second = (run / "second.log").read_text()
    assert done.stdout.splitlines() == ["second exit 1"], done.stdout + second
    # The failed write left nothing: epoch 1's checkpoint is alone (no temporary file, no second checkpoint), and a
    # resume continues from it.
    kept = sorted(p.name for p in ckpt.checkpoint_dir(run / "after").iterdir())
    assert len(kept) == 1 and kept[0].startswith("ckpt-"), kept
    state, resumed = ckpt.load_latest(run / "after")
    assert resumed.name == kept[0] and state["epoch"] == 1
    # One line saying why, no traceback; the state says failed with the same reason.
    path = run / "checkpoints" / f"ckpt-{int(kept[0][5:15]) * 2:010d}.pt"
    said = f"no space left on device writing {path} (ENOSPC); the previous checkpoint {kept[0]} is intact"
    assert said in second and "Traceback" not in second, second
    events = [json.loads(line) for line in (run / rundir.STATE_LOG).read_text().splitlines()]
    assert events[-1]["event"] == rundir.FAILED and said in events[-1]["reason"], events[-1]
    assert rundir.fold(events).state == rundir.FAILED
