"""Sweeps: --sweep grids and sweep files become one job per point (train.* keys only)."""

import subprocess

import pytest

from hpc_train.config import NO_SITE, JobSources, dump_yaml, resolve, sweep_points
from hpc_train.errors import ConfigError
from hpc_train.render import render_plain


def test_grid_of_two_axes():
    points = sweep_points(["train.loss.name=ce,balanced_softmax", "train.seed=[0, 1, 2]"])
    assert len(points) == 6
    assert points[0] == {"train.loss.name": "ce", "train.seed": 0}
    assert points[-1] == {"train.loss.name": "balanced_softmax", "train.seed": 2}


def test_sweep_file_grid_and_points(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("train.optim.lr: [0.1, 0.05]\ntrain.loss.tau: [1.0, 2.0]\n")
    assert sweep_points(sweep_file=grid) == [
        {"train.optim.lr": 0.1, "train.loss.tau": 1.0}, {"train.optim.lr": 0.1, "train.loss.tau": 2.0},
        {"train.optim.lr": 0.05, "train.loss.tau": 1.0}, {"train.optim.lr": 0.05, "train.loss.tau": 2.0}]
    explicit = tmp_path / "points.yaml"
    explicit.write_text("points:\n  - {train.loss.name: ce}\n  - {train.loss.name: ldam, train.model.classifier: cosine}\n")
    # Points combine with a command-line grid.
    assert sweep_points(["train.seed=0,1"], explicit) == [
        {"train.loss.name": "ce", "train.seed": 0}, {"train.loss.name": "ce", "train.seed": 1},
        {"train.loss.name": "ldam", "train.model.classifier": "cosine", "train.seed": 0},
        {"train.loss.name": "ldam", "train.model.classifier": "cosine", "train.seed": 1}]


@pytest.mark.parametrize("item,message", [
    ("slurm.nodes=1,2", "may only vary train.* keys"),
    ("train.nope=1,2", "unknown key 'train.nope'"),
    ("train.seed", "expected KEY=V1,V2"),
])
def test_bad_sweeps(item, message):
    with pytest.raises(ConfigError, match=message):
        sweep_points([item])


def test_sweep_renders_one_array_with_a_job_per_task():
    specs = resolve(None, sweeps=["train.seed=3,4,5"], site=NO_SITE).sweep
    assert [s.train.seed for s in specs] == [3, 4, 5]
    script = render_plain(specs[0], JobSources(job_file=None, site_file=None, template_dirs=()), sweep=specs,
                          max_parallel=2)
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --output=slurm-%x-%A_%a.out" in script
    assert "readonly HT_POINT_COUNT=3" in script.splitlines()
    assert """printf '%s' "${HT_POINT_YAMLS[task_id]}" | run_file_write "$RUN_DIR/job.yaml\"""" in script
    preamble = script[script.index("readonly "):script.index("# Stop at the first failing")]
    for task, seed in enumerate((3, 4, 5)):  # the array as bash reads it: task T's job is point T's
        point = subprocess.run(["bash", "-c", preamble + f'printf %s "${{HT_POINT_YAMLS[{task}]}}"'],
                               capture_output=True, text=True, check=True).stdout
        assert f"\n  seed: {seed}\n" in point and point == dump_yaml(specs[task])
