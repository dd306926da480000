"""The one place that couples hpc-train to submitit internals.

submitit builds its sbatch file in ``SlurmExecutor._make_submission_file_text(command, uid)``; we
override that hook so the file submitit writes and submits is *our* template, rendered with submitit's
launch line (``python -u -m submitit.core._submit <folder>``) and submitit's log paths. Everything else
(pickling the callable, job ids, result pickles, arrays) stays submitit's. sbatch itself runs through
:func:`hpc_train.slurm.sbatch_process.run_sbatch` (``_submit_command``, submitit's steps around it kept), so a Ctrl-C
while it runs still has what sbatch said and the job id it printed.

tests/unit/slurm/test_submitit_hook.py takes the lines submitit needs from the installed submitit's own builder
at test time and checks each is in ours, so an upgrade that changes them fails loudly.
"""

from __future__ import annotations

import dataclasses
import shlex
import uuid
from pathlib import Path
from typing import Any, Sequence

import submitit
from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmJob

from ..config import JobSpec
from ..errors import TemplateError
from ..render import LaunchSpec, array_tasks, render_sbatch
from .sbatch_process import run_sbatch


def submitit_launch(folder: Path, command: str, *, map_count: int | None = None,
                    array_parallelism: int | None = None) -> LaunchSpec:
    """Log paths and array line exactly as submitit's own builder makes them."""
    paths = JobPaths(folder=folder)
    stdout, stderr = str(paths.stdout), str(paths.stderr)
    array = None
    if map_count is not None:
        array = f"0-{map_count - 1}%{min(map_count, array_parallelism or map_count)}"
        stdout, stderr = stdout.replace("%j", "%A_%a"), stderr.replace("%j", "%A_%a")
    return LaunchSpec(
        form="submitit",
        stdout=stdout.replace("%t", "0"),
        stderr=stderr.replace("%t", "0"),
        command=command,
        task_stdout=stdout,
        task_stderr=stderr,
        array=array,
    )


class TemplateSlurmExecutor(submitit.SlurmExecutor):
    """A SlurmExecutor whose submission file is hpc-train's rendered template."""

    def __init__(self, folder: Path, spec: JobSpec, *, runs_root: str, python: str,
                 site_dirs: Sequence[Path] = (), run_dir: str | None = None,
                 array_specs: Sequence[JobSpec] = (), sweep_launch: dict[str, Any] | None = None) -> None:
        # submitit requeues on its own only for Checkpointable callables; ours is not, and our handler
        # (hpc_train/rank/preempt.py) does the checkpoint and requeue in every rank.
        super().__init__(folder=folder, max_num_timeout=0, python=shlex.quote(python))
        self._spec = spec
        self._runs_root = runs_root
        self._python = python
        self._site_dirs = tuple(site_dirs)
        self._run_dir = run_dir
        self._array_specs = tuple(array_specs)
        self._sweep_launch = dict(sweep_launch or {})
        """``points_dir``, ``point_offset``, ``sweep_id`` of this array of a sweep (:class:`~hpc_train.render.LaunchSpec`)."""
        # Only what submitit itself reads back (signal lead time for its own bookkeeping).
        self.update_parameters(signal_delay_s=spec.slurm.signal_delay_s, time=spec.slurm.time_min)

    def _internal_process_submissions(self, delayed_submissions: list[Any]) -> list[Any]:
        """submitit's own path, done here for two reasons: arrays (``executor.batch()``) go through a fresh
        *plain* SlurmExecutor there, which would bypass our template; and a refused submission must leave
        no pickle or submission file behind (submitit keeps them)."""
        folder = JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._temporary_files: list[Path] = []
        try:
            pickle_paths = []
            for delayed in delayed_submissions:
                pickle_path = folder / f"{uuid.uuid4().hex}.pkl"
                self._temporary_files.append(pickle_path)
                delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
                delayed.dump(pickle_path)
                pickle_paths.append(pickle_path)
            if len(delayed_submissions) == 1:
                job = self._submit_command(self._submitit_command_str)
                job.paths.move_temporary_file(pickle_paths[0], "submitted_pickle")
                return [job]
            self.parameters["map_count"] = len(delayed_submissions)
            try:
                self._throttle()
                first_job = self._submit_command(self._submitit_command_str)
            finally:
                del self.parameters["map_count"]
        except BaseException:
            for path in self._temporary_files:
                path.unlink(missing_ok=True)
            raise
        tasks = list(range(first_job.num_tasks))
        jobs = [SlurmJob(folder=self.folder, job_id=f"{first_job.job_id}_{index}", tasks=tasks)
                for index in range(len(delayed_submissions))]
        for job, pickle_path in zip(jobs, pickle_paths):
            job.paths.move_temporary_file(pickle_path, "submitted_pickle")
        return jobs

    def _submit_command(self, command: str) -> SlurmJob:
        """submitit's ``Executor._submit_command`` step for step, with sbatch run by :func:`run_sbatch` instead of
        submitit's ``CommandFunction`` (which keeps sbatch's stderr where a Ctrl-C loses it)."""
        uid = uuid.uuid4().hex
        submission_file = JobPaths.get_first_id_independent_folder(self.folder) / f".submission_file_{uid}.sh"
        submission_file.write_text(self._make_submission_file_text(command, uid), encoding="utf-8")
        output = run_sbatch(self._make_submission_command(submission_file))
        job = self.job_class(folder=self.folder, job_id=self._get_job_id_from_submission_command(output),
                             tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(submission_file, "submission_file", keep_as_symlink=True)
        self._write_job_id(job.job_id, uid)
        self._set_job_permissions(job.paths.folder)
        return job

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        # submitit writes this text to .submission_file_<uid>.sh; remember it, to remove it if sbatch refuses.
        folder = JobPaths.get_first_id_independent_folder(self.folder)
        getattr(self, "_temporary_files", []).append(folder / f".submission_file_{uid}.sh")
        params: dict[str, Any] = self.parameters
        map_count = params.get("map_count")
        launch = submitit_launch(self.folder, command, map_count=map_count,
                                 array_parallelism=params.get("array_parallelism"))
        launch = dataclasses.replace(launch, run_dir=self._run_dir, **(self._sweep_launch if map_count else {}))
        if map_count is not None and array_tasks(len(self._array_specs), self._spec.slurm.pack) != map_count:
            raise TemplateError(f"submitit batched {map_count} jobs but {len(self._array_specs)} sweep points were "
                                "rendered; submit sweeps through hpc_train.slurm.queue")
        return render_sbatch(self._spec, runs_root=self._runs_root, python=self._python, launch=launch,
                             site_dirs=self._site_dirs, array_specs=self._array_specs if map_count else ())
