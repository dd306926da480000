"""Promises kept at the edges (issue 19, items 3-6): an empty job file, a run index that cannot be written, a
site template without srun, a template directory that does not exist, and a template name that is a path are
each exit 2 in one or two lines, with nothing written and nothing queued. Slurm is a stand-in on PATH."""

import os
import sys
from pathlib import Path

from tests.cli_helpers import assert_refused, cli, tree


def _env(tmp_path, **extra):
    site = tmp_path / "empty-site.yaml"
    site.write_text("{}\n")
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
            "HPC_TRAIN_SITE": str(site), "HPC_TRAIN_STATE_DIR": str(tmp_path / "state"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **extra}


def test_an_empty_job_file_is_refused_not_the_default_job(tmp_path, stub_slurm):
    # Item 3: it submitted the default job under the name hpc-train (exit 0, queued).
    work = tmp_path / "work"
    work.mkdir()
    (work / "empty.yaml").write_text("# nothing yet\n")
    (work / "braces.yaml").write_text("{}\n")
    for job in ("empty.yaml", "braces.yaml"):
        before = tree(work)
        result = cli("submit", job, cwd=work, env=stub_slurm.env(HPC_TRAIN_STATE_DIR=str(tmp_path / "state")))
        assert_refused(result, f"job file {job} is empty")
        assert tree(work) == before and stub_slurm.calls("sbatch") == []


def test_a_run_index_that_cannot_be_written_queues_nothing(tmp_path, stub_slurm):
    # Item 4: the job was queued with a warning; the README promises exit 2.
    (tmp_path / "a-file").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    for state_dir in (tmp_path / "a-file" / "state", Path("/proc/hpc-train-state")):
        local_env = _env(tmp_path, HPC_TRAIN_STATE_DIR=str(state_dir))
        before = tree(tmp_path)
        result = cli("submit", cwd=work, env=stub_slurm.env(HPC_TRAIN_STATE_DIR=str(state_dir)))
        assert_refused(result, f"cannot record runs in {state_dir / 'runs.jsonl'}")
        assert "HPC_TRAIN_STATE_DIR" in result.stderr
        assert tree(tmp_path) == before and stub_slurm.calls("sbatch") == []
        local = cli("submit", "--cluster", "local", cwd=work, env=local_env)
        assert_refused(local, "cannot record runs in")
        assert tree(tmp_path) == before


def _site(tmp_path, template_text, dirs=("tpl",)):
    (tmp_path / "tpl").mkdir(exist_ok=True)
    (tmp_path / "tpl" / "custom.j2").write_text(template_text)
    (tmp_path / "site.yaml").write_text(f"template_dirs: [{', '.join(dirs)}]\nslurm: {{template: custom.j2}}\n")
    return _env(tmp_path, HPC_TRAIN_SITE=str(tmp_path / "site.yaml"))


def test_a_site_template_without_srun_is_refused_with_the_fix(tmp_path, stub_slurm):
    # Item 5: a template with no srun was queued without a word (its launch line would run once, in the batch
    # shell, instead of one task per rank).
    env = _site(tmp_path, '#!/bin/bash\n{{ sbatch_header }}\n{{ job_variables }}\n"$HT_PYTHON" -m hpc_train.train\n')
    before = tree(tmp_path)
    for args in (["render"], ["submit"], ["submit", "--dry-run"]):
        result = cli(*args, cwd=tmp_path, env={**stub_slurm.env(), **env, "PATH": stub_slurm.env()["PATH"]})
        assert_refused(result, "custom.j2: the script never runs srun")
        assert "{# hpc-train: launches-itself #}" in result.stderr
    assert tree(tmp_path) == before and stub_slurm.calls("sbatch") == []
    # A template that starts its ranks its own way says so, and renders.
    (tmp_path / "tpl" / "custom.j2").write_text("#!/bin/bash\n{# hpc-train: launches-itself #}\n"
                                                 '{{ job_variables }}\nmpirun "$HT_PYTHON" -m hpc_train.train\n')
    assert cli("render", cwd=tmp_path, env=env).returncode == 0
    # ...or a partial it includes does (a site that replaced only the launch block).
    (tmp_path / "tpl" / "partials").mkdir()
    (tmp_path / "tpl" / "partials" / "launch.j2").write_text("{# hpc-train: launches-itself #}\nmpirun hostname\n")
    (tmp_path / "tpl" / "custom.j2").write_text('#!/bin/bash\n{% include "partials/launch.j2" %}\n')
    assert cli("render", cwd=tmp_path, env=env).returncode == 0
    # srun anywhere a command runs it counts: after exec or env, or in the code of bash -c.
    from hpc_train.config import NO_SITE, resolve_job
    from hpc_train.render import render_sbatch

    spec, _ = resolve_job(None, site=NO_SITE, sets=["slurm.template=custom.j2"])
    for launch in ("exec srun true", "env A=1 srun true", "bash -c 'srun true'", "if true; then srun true; fi"):
        (tmp_path / "tpl" / "custom.j2").write_text(f"#!/bin/bash\n{launch}\n")
        assert render_sbatch(spec, runs_root="/r", python="python3", site_dirs=[tmp_path / "tpl"]), launch


def test_a_template_directory_that_does_not_exist_is_refused(tmp_path):
    # Item 5: a template_dirs entry that does not exist was silently ignored (the site's templates left out).
    env = _site(tmp_path, "#!/bin/bash\nsrun true\n", dirs=("tpl", "no-such-dir"))
    before = tree(tmp_path)
    result = cli("render", cwd=tmp_path, env=env)
    assert_refused(result, f"template_dirs entry 'no-such-dir' ({tmp_path / 'no-such-dir'}) does not exist")
    assert "templates export" in result.stderr and tree(tmp_path) == before
    (tmp_path / "no-such-dir").write_text("")
    assert_refused(cli("templates", "list", cwd=tmp_path, env=env), "is not a directory")


def test_templates_show_takes_names_on_the_search_path_only(tmp_path):
    # Item 6: `templates show ../../../../etc/passwd` printed the file.
    env = _env(tmp_path)
    (tmp_path / "secret.j2").write_text("secret\n")
    for name in ("../../../../etc/passwd", "/etc/passwd", "../" * 12 + str(tmp_path / "secret.j2"),
                 "partials/../../../../etc/passwd"):
        result = cli("templates", "show", name, cwd=tmp_path, env=env)
        assert_refused(result, f"no template {name!r} on the search path")
        assert "root:" not in result.stdout and "secret" not in result.stdout
    shown = cli("templates", "show", "partials/bootstrap.j2", cwd=tmp_path, env=env)
    assert shown.returncode == 0 and "module purge" in shown.stdout


def test_the_local_runner_without_its_plan_says_how_it_is_run():
    # Review of issue 19, N6: `python -m hpc_train.local` with no arguments was an IndexError traceback.
    import subprocess

    result = subprocess.run([sys.executable, "-m", "hpc_train.local"], capture_output=True, text=True, timeout=60)
    assert_refused(result, "usage: python -m hpc_train.local PLAN.json | --pack RUN_DIR...")
