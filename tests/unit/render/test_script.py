"""hpc_train/render/script.py on its own: render_sbatch puts the preamble where the template asks for it, with only
the variables the body reads; a script that never runs srun is refused unless its template says it launches its
ranks itself; a sweep needs an array; a pack of one job is no pack."""

from __future__ import annotations

import pytest

from hpc_train.config import resolve_job
from hpc_train.config.layers import NO_SITE
from hpc_train.errors import TemplateError
from hpc_train.render.script import LAUNCHES_ITSELF, LaunchSpec, array_tasks, render_sbatch, watchdog_on


def job(*sets, **flags):
    spec, _ = resolve_job(None, site=NO_SITE, sets=list(sets), flags=flags)
    return spec


def site_render(tmp_path, body, *sets, **kwargs):
    (tmp_path / "t.sbatch.j2").write_text(body)
    return render_sbatch(job("slurm.template=t.sbatch.j2", *sets), runs_root="/runs", python="python3",
                         site_dirs=[tmp_path], **kwargs)


def test_the_preamble_stands_where_the_template_asks_and_holds_what_the_body_reads(tmp_path):
    text = site_render(tmp_path, '#!/bin/bash\n{{ sbatch_header }}{{ job_variables }}srun echo "$HT_NAME" "$HT_NODES"\n')
    lines = text.splitlines()
    readonly = [line for line in lines if line.startswith("readonly ")]
    assert readonly == ["readonly HT_NAME=digits-lt-demo", "readonly HT_NODES=1"]
    assert lines.index(readonly[0]) > max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert lines[-1] == 'srun echo "$HT_NAME" "$HT_NODES"'


def test_the_job_environment_is_exported(tmp_path):
    text = site_render(tmp_path, "#!/bin/bash\n{{ job_environment }}srun true\n", "slurm.env.NCCL_DEBUG=INFO")
    assert "export NCCL_DEBUG=INFO" in text.splitlines()


def test_a_script_that_never_runs_srun_is_refused(tmp_path):
    with pytest.raises(TemplateError, match=r"t\.sbatch\.j2: the script never runs srun"):
        site_render(tmp_path, "#!/bin/bash\n# srun in a comment does not count\npython -m x\n")
    assert "mpirun" in site_render(tmp_path, f"#!/bin/bash\n{LAUNCHES_ITSELF}\nmpirun python -m x\n")


def test_a_sweep_needs_an_array():
    spec = job()
    with pytest.raises(TemplateError, match="without an --array range"):
        render_sbatch(spec, runs_root="/r", python="python3", array_specs=[spec])


def test_a_pack_of_one_job_asks_for_one_jobs_cores():
    packed = job("slurm.pack=2", "slurm.cpus_per_task=3", "slurm.tasks_per_node=1")
    assert "#SBATCH --cpus-per-task=3" in render_sbatch(packed, runs_root="/r", python="python3").splitlines()


def test_array_tasks_and_the_watchdog():
    assert [array_tasks(points, 2) for points in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert array_tasks(3, 0) == 3
    assert watchdog_on(job("slurm.hang_timeout_s=600")) and not watchdog_on(job("slurm.hang_timeout_s=0"))
    assert not watchdog_on(job("slurm.hang_timeout_s=600", "slurm.pack=2", "slurm.tasks_per_node=1"))
