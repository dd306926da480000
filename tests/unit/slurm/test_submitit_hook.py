"""Our sbatch file carries every line submitit needs, taken from the installed submitit's own builder.

If a submitit upgrade changes its log paths, signal line, open mode or launch command, this fails.
"""

import shlex
import subprocess
from pathlib import Path

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from hpc_train.config import SiteConfig, resolve_job
from hpc_train.render import render_sbatch
from hpc_train.slurm.submitit_hook import submitit_launch

NO_SITE = SiteConfig(path=None, defaults={}, template_dirs=())


def sbatch_options(text):
    return {line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH ")}


def srun_words(text):
    """The words of the srun command (backslash continuations joined)."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        if line.strip().startswith("srun "):
            return shlex.split(line)
    raise AssertionError("no srun line")


def our_srun_words(text):
    """The words our srun command gets, as bash expands them: the line run after the script's preamble, printing its
    arguments (submitit's command is the launch array's words, HT_LAUNCH_COMMAND)."""
    joined = text.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.strip().startswith("srun "))
    preamble = text[text.index("readonly "):text.index("# Stop at the first failing")]
    printed = subprocess.run(["bash", "-c", preamble + "printf '%s\\0' " + line.strip().rstrip("&")],
                             capture_output=True, text=True, check=True).stdout
    return printed.split("\0")[:-1]


@pytest.mark.parametrize("map_count", [None, 3])
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_submitit_lines_are_in_ours(tmp_path, map_count, launcher):
    folder = tmp_path / "runs dir" / "job" / ".submitit"
    command = f"/venv/bin/python -u -m submitit.core._submit {shlex.quote(str(folder))}"
    spec, _ = resolve_job(None, site=NO_SITE, flags={"slurm.launcher": launcher})
    params = {"map_count": map_count, "array_parallelism": 2} if map_count else {}
    theirs = _make_sbatch_string(command=command, folder=folder, signal_delay_s=spec.slurm.signal_delay_s, **params)
    launch = submitit_launch(folder, command, map_count=map_count, array_parallelism=2 if map_count else None)
    ours = render_sbatch(spec, runs_root=str(tmp_path / "runs dir"), python="/venv/bin/python", launch=launch)

    needed = {opt for opt in sbatch_options(theirs)
              if opt.split("=")[0] in ("--output", "--error", "--open-mode", "--signal", "--array")}
    assert {o.split("=")[0] for o in needed} >= {"--output", "--error", "--open-mode", "--signal"}
    ours_options = sbatch_options(ours)
    for option in needed:
        if option.startswith("--signal") and launcher == "torchrun":
            # torchrun: the batch shell takes the signal (B:) and forwards it to the workers.
            option = option.replace("--signal=", "--signal=B:")
        assert option in ours_options, f"submitit needs {option!r}, ours has {sorted(ours_options)}"

    assert "export SUBMITIT_EXECUTOR=slurm" in theirs and "export SUBMITIT_EXECUTOR=slurm" in ours
    # The srun line: submitit's per-task --output/--error and its _submit command, word for word.
    their_srun, our_srun = srun_words(theirs), our_srun_words(ours)
    i = their_srun.index("--output")
    assert f"--output={their_srun[i + 1]}" in our_srun
    j = their_srun.index("--error")
    assert f"--error={their_srun[j + 1]}" in our_srun
    cmd = shlex.split(command)
    assert our_srun[-len(cmd):] == cmd or our_srun[-len(cmd) - 1:-1] == cmd


def test_executor_renders_our_template(tmp_path, monkeypatch):
    """The executor subclass produces our script from submitit's own call path (no sbatch run)."""
    import shutil

    from hpc_train.slurm.submitit_hook import TemplateSlurmExecutor

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/bin/" + name)  # SlurmExecutor wants srun
    spec, _ = resolve_job(None, site=NO_SITE)
    executor = TemplateSlurmExecutor(tmp_path / ".submitit", spec, runs_root=str(tmp_path), python="/venv/bin/python")
    text = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert text.startswith("#!/bin/bash\n# digits-lt-demo: rendered by hpc-train")
    assert f"-m submitit.core._submit {tmp_path / '.submitit'}" in text
    assert Path(executor.folder) == tmp_path / ".submitit"


def _called_names(function):
    """The names a function calls, in order (``self._write_job_id(...)`` -> ``_write_job_id``)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = sorted((node.func for node in ast.walk(tree) if isinstance(node, ast.Call)),
                   key=lambda func: (func.lineno, func.col_offset))
    names = [call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", "") for call in calls]
    return [name for name in names if name]


def test_our_submit_command_takes_every_step_of_the_installed_submitits():
    """TemplateSlurmExecutor._submit_command is submitit's own with sbatch run by run_sbatch (a Ctrl-C keeps what
    sbatch said): if a submitit upgrade adds, drops or renames a step, our copy must follow, and this fails."""
    from submitit.core.core import PicklingExecutor

    from hpc_train.slurm.submitit_hook import TemplateSlurmExecutor

    theirs = [name for name in _called_names(PicklingExecutor._submit_command) if name != "CommandFunction"]
    ours = [name for name in _called_names(TemplateSlurmExecutor._submit_command) if name != "run_sbatch"]
    steps = {"get_first_id_independent_folder", "_make_submission_file_text", "_make_submission_command",
             "_get_job_id_from_submission_command", "_num_tasks", "job_class", "move_temporary_file",
             "_write_job_id", "_set_job_permissions"}
    assert steps <= set(theirs), theirs  # the steps we copied are still submitit's
    assert set(theirs) - {"open", "write", "write_text"} <= set(ours), (theirs, ours)  # and there is no new one
    after_sbatch = ["move_temporary_file", "_write_job_id", "_set_job_permissions"]  # the order of what they write
    assert [n for n in ours if n in after_sbatch] == [n for n in theirs if n in after_sbatch] == after_sbatch
