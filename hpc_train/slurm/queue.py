"""Queueing jobs on Slurm through submitit: one job, job arrays (a sweep, split at MaxArraySize), a
continuation of a run (``--resume``) and chains of dependent jobs (``--chain``); the script and Slurm's verdict
of a dry run. Choosing the cluster, registering runs and following them is the front's (:mod:`hpc_train.front`);
what both backends write into a run directory is :mod:`hpc_train.runs.submission`.

A submission is all or nothing: a refused job leaves no run directory, no submitit files and, in a
chain, no job of the chain queued.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..config import JobSources, JobSpec, Resolved, dump_yaml
from ..errors import HpcTrainError, SubmitError, SubmitInterrupted
from ..render import LaunchSpec, array_tasks, render_sbatch
from ..render.plain import resolve_python
from ..runs import rundir
from ..runs.submission import SubmitResult, continue_run_record, run_record, submission_facts, write_run_files
from ..runs.undo import Created
from . import client as slurm_cli
from .sbatch_process import SbatchInterrupted

SWEEPS_DIR = ".sweeps"
"""Under a job's directory of runs: each submitted sweep's point files and its arrays' scripts."""


def submitit_folder(group: Path) -> Path:
    """submitit's pickles and logs for a job name (on a shared filesystem, like the runs)."""
    return group / ".submitit"


def _submitit_command(python: str, folder: Path) -> str:
    return " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def with_site_gpu_flag(resolved: Resolved) -> tuple[JobSpec, list[JobSpec]]:
    """The job and its sweep points with ``slurm.gpu_flag`` set, where the site has not chosen it, by the
    reachable Slurm's version: asked once (``sinfo --version``), not once per sweep point."""
    flag: str | None = None

    def chosen(spec: JobSpec) -> JobSpec:
        nonlocal flag
        if spec.slurm.gpu_flag is not None or spec.slurm.gpus_per_node == 0:
            return spec
        flag = flag or slurm_cli.gpu_flag_for(slurm_cli.version())
        return dataclasses.replace(spec, slurm=dataclasses.replace(spec.slurm, gpu_flag=flag))

    return chosen(resolved.spec), [chosen(s) for s in resolved.sweep]


def dry_run_script(spec: JobSpec, sources: JobSources, *, cwd: Path | None = None, interpreter: str | None = None,
                   sweep: Sequence[JobSpec] = (), max_parallel: int | None = None,
                   resume_dir: Path | None = None) -> str:
    """The script ``submit`` would hand to sbatch (submitit form), written nowhere."""
    from .submitit_hook import submitit_launch  # submitit is imported only when submitting

    root = rundir.runs_root(spec.runs_dir, cwd)
    folder = submitit_folder(rundir.run_group(root, spec.name))
    python = resolve_python(spec, interpreter)
    launch = submitit_launch(folder, _submitit_command(python, folder),
                             map_count=array_tasks(len(sweep), spec.slurm.pack) if sweep else None,
                             array_parallelism=max_parallel)
    launch = dataclasses.replace(launch, run_dir=str(resume_dir) if resume_dir else None)
    return render_sbatch(spec, runs_root=str(root), python=python, launch=launch, site_dirs=sources.template_dirs,
                         array_specs=sweep)


def preflight(spec: JobSpec, script: str) -> list[str]:
    """Ask the reachable Slurm about a job without queueing it: partition and account exist, and
    ``sbatch --test-only`` accepts the script. Raises SubmitError with Slurm's reason (exit 2)."""
    report = []
    s = spec.slurm
    if s.partition is not None:
        if not slurm_cli.partition_exists(s.partition):
            raise SubmitError(f"partition {s.partition!r} does not exist on this cluster (see `sinfo -s`)")
        report.append(f"partition {s.partition}: ok")
    if s.account is not None:
        known = slurm_cli.account_exists(s.account)
        if known is False:
            raise SubmitError(f"account {s.account!r} is not known to Slurm accounting (see `sacctmgr show assoc user=$USER`)")
        report.append(f"account {s.account}: {'ok' if known else 'not checked (no accounting)'}")
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as handle:
        handle.write(script)
    try:
        verdict = slurm_cli.test_only(handle.name)
    finally:
        os.unlink(handle.name)
    report.append(f"sbatch --test-only: {verdict}")
    return report


def _submitit_logs(folder: Path, job_id: str) -> dict[str, str]:
    """Where submitit's form writes: the batch shell and rank 0 share ``<id>_0_log.*``."""
    return {"batch": str(folder / f"{job_id}_0_log.err"),
            "rank_out": str(folder / f"{job_id}_{{rank}}_log.out"),
            "rank_err": str(folder / f"{job_id}_{{rank}}_log.err")}


def _train_job(spec: JobSpec, run_dir: str | None):
    # torch-free to import and unpickle; the training code is imported when the callable runs.
    from ..rank.callable import CommandJob, TorchrunJob, TrainJob

    job_class = TorchrunJob if spec.slurm.launcher == "torchrun" else CommandJob if spec.command else TrainJob
    return job_class(dump_yaml(spec), run_dir or "")


def _point_job(spec: JobSpec, point_file: Path):
    from ..rank.callable import CommandJob, TorchrunJob, TrainJob

    job_class = TorchrunJob if spec.slurm.launcher == "torchrun" else CommandJob if spec.command else TrainJob
    return job_class(str(point_file), "")


def _sbatch_refused(exc: Exception) -> SubmitError:
    text = getattr(exc, "output", None) or getattr(exc, "stderr", None) or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return SubmitError(f"sbatch refused the job: {slurm_cli.slurm_message(str(text))}")


def _sbatch_interrupted(exc: SbatchInterrupted, job_name: str) -> SubmitInterrupted:
    """What became of the job sbatch was queueing when Ctrl-C came: the id it printed (cancelled with the rest of
    the submission), else where to look for it."""
    job_id = exc.job_id
    if job_id:
        return SubmitInterrupted(f"interrupted: sbatch had queued job {job_id}; scancel was asked to cancel it with "
                                 f"the rest of this submission (a warning above says if that failed; `squeue --me -j "
                                 f"{job_id}` shows it)")
    return SubmitInterrupted(f"interrupted while sbatch ran: job {job_name!r} may be queued all the same; "
                             f"see `squeue --me --name {shlex.quote(job_name)}` and scancel it (its files are removed)")


@contextlib.contextmanager
def _sbatch_said_once(job_name: str, queued: list[str]) -> Iterator[None]:
    """A refusal of sbatch as our one line (:func:`_sbatch_refused`: Slurm's reason, without its noise). What is
    printed while sbatch runs is held back until the submission is accepted, when it is the user's to see. A
    Ctrl-C (exit 130) prints what was held and what sbatch wrote (:class:`~.sbatch_process.SbatchInterrupted`), adds
    the job it printed to ``queued`` (the submission's undo cancels it) and says what became of the job."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            yield
    except SbatchInterrupted as exc:
        sys.stderr.write(printed.getvalue() + exc.stderr)
        if exc.job_id:
            queued.append(exc.job_id)
        raise _sbatch_interrupted(exc, job_name) from None
    except KeyboardInterrupt:  # before sbatch ran: nothing queued by it; what was held is still the user's
        sys.stderr.write(printed.getvalue())
        raise
    except Exception as exc:  # submitit wraps sbatch's refusal (FailedJobError, CalledProcessError)
        raise _sbatch_refused(exc) from None
    sys.stderr.write(printed.getvalue())


class _SlurmSubmission:
    """One submission's jobs, and what they created (undone, with the jobs cancelled, if a later one fails)."""

    def __init__(self, resolved: Resolved, cwd: Path | None, interpreter: str | None,
                 snapshot: dict[str, str] | None = None) -> None:
        self.snapshot = snapshot
        self.spec, self.sweep = with_site_gpu_flag(resolved)
        self.sources = resolved.sources
        self.root = rundir.runs_root(self.spec.runs_dir, cwd)
        self.group = rundir.run_group(self.root, self.spec.name)
        self.python = resolve_python(self.spec, interpreter)
        self.created = Created()
        self.queued: list[str] = []
        self.folder = self.created.mkdir(submitit_folder(self.group))
        self.facts = submission_facts()

    def executor(self, spec: JobSpec, resume_dir: Path | None = None, array_specs: Sequence[JobSpec] | None = None,
                 sweep_launch: dict[str, Any] | None = None):
        from .submitit_hook import TemplateSlurmExecutor

        return TemplateSlurmExecutor(self.folder, spec, runs_root=str(self.root), python=self.python,
                                     site_dirs=self.sources.template_dirs,
                                     run_dir=str(resume_dir) if resume_dir else None,
                                     array_specs=self.sweep if array_specs is None else array_specs,
                                     sweep_launch=sweep_launch)

    def one(self, spec: JobSpec, resume_dir: Path | None) -> tuple[Any, Path]:
        with _sbatch_said_once(spec.name, self.queued):
            job = self.executor(spec, resume_dir).submit(_train_job(spec, None))
        job_id = str(job.job_id)
        self.queued.append(job_id)
        script = Path(job.paths.submission_file).read_text(encoding="utf-8")
        logs = _submitit_logs(self.folder, job_id)
        if resume_dir is None:
            run_dir = self.group / job_id
            record = run_record(spec, self.sources, run_dir, job_id=job_id, cluster="slurm", logs=logs,
                                submission=self.facts, extra={"submitit_folder": str(self.folder)})
            write_run_files(self.created, run_dir, spec, record, script=script, snapshot=self.snapshot)
            return job, run_dir
        self.created.write(resume_dir / f"job-{job_id}.sbatch", script)
        continue_run_record(resume_dir, job_id, logs)
        return job, resume_dir

    def _stage_points(self) -> Path:
        """Each point's resolved job, written before any array is queued: the tasks read their own (one small file
        per point) instead of a script that carries them all."""
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        points_dir = self.created.mkdir(self.group / SWEEPS_DIR / stamp)
        self.point_yamls = [dump_yaml(task_spec) for task_spec in self.sweep]  # once per point: dumping is the cost
        for point, text in enumerate(self.point_yamls):
            self.created.write(points_dir / f"point-{point}.yaml", text)
        return points_dir

    def _submit_array(self, first_task: int, tasks: int, points_dir: Path, sweep_id: str | None,
                      max_parallel: int | None) -> list[Any]:
        pack = self.spec.slurm.pack
        first_point = first_task * pack
        executor = self.executor(self.spec, array_specs=self.sweep[first_point:(first_task + tasks) * pack],
                                 sweep_launch={"points_dir": str(points_dir), "point_offset": first_point,
                                               "sweep_id": sweep_id})
        if max_parallel:
            executor.update_parameters(array_parallelism=max_parallel)
        with _sbatch_said_once(self.spec.name, self.queued), executor.batch():  # each task reads its first point's file (a path)
            jobs = [executor.submit(_point_job(self.sweep[task * pack], points_dir / f"point-{task * pack}.yaml"))
                    for task in range(first_task, first_task + tasks)]
        self.queued.append(str(jobs[0].job_id).split("_")[0])
        return jobs

    def array(self, max_parallel: int | None) -> SubmitResult:
        """One sweep: job arrays of at most the cluster's MaxArraySize tasks each (`--max-parallel` is ``%N`` on
        each), every point a run directory ``<first array id>_<point>``."""
        pack = self.spec.slurm.pack
        tasks = array_tasks(len(self.sweep), pack)
        per_array = slurm_cli.max_array_size()
        points_dir = self._stage_points()
        jobs: list[Any] = []
        array_ids: list[str] = []
        for first_task in range(0, tasks, per_array):
            made = self._submit_array(first_task, min(per_array, tasks - first_task), points_dir,
                                      array_ids[0] if array_ids else None, max_parallel)
            array_ids.append(str(made[0].job_id).split("_")[0])
            script = Path(made[0].paths.submission_file).read_text(encoding="utf-8")
            self.created.write(points_dir / f"array-{array_ids[-1]}.sbatch", script)  # one script per array
            jobs.extend(made)
        sweep_id = array_ids[0]
        run_dirs = []
        for point, task_spec in enumerate(self.sweep):
            task_id = str(jobs[point // pack].job_id)
            run_dir = self.group / f"{sweep_id}_{point}"
            logs = _submitit_logs(self.folder, task_id) if pack == 1 else rundir.own_logs(run_dir)
            extra = {"submitit_folder": str(self.folder), "array_job_id": task_id.split("_")[0], "pack": pack,
                     "sweep_id": sweep_id, "array_job_ids": array_ids,
                     "job_script": str(points_dir / f"array-{task_id.split('_')[0]}.sbatch")}
            record = run_record(task_spec, self.sources, run_dir, job_id=task_id, cluster="slurm", logs=logs,
                                submission=self.facts, extra=extra)
            write_run_files(self.created, run_dir, task_spec, record, snapshot=self.snapshot,
                            job_yaml=self.point_yamls[point])
            self.created.link(run_dir / rundir.JOB_SCRIPT, Path(extra["job_script"]))  # its array's one script
            run_dirs.append(str(run_dir))
        packed = f", {pack} point(s) per task" if pack > 1 else ""
        arrays = f"job array {sweep_id}" if len(array_ids) == 1 else (
            f"{len(array_ids)} job arrays {', '.join(array_ids)} (MaxArraySize {per_array})")
        return SubmitResult(job_id=sweep_id, run_name=f"{self.spec.name}/{sweep_id}_*", run_dir=str(self.group),
                            cluster="slurm", tasks=tuple(Path(d).name for d in run_dirs), run_dirs=tuple(run_dirs),
                            note=f"{arrays}: {len(jobs)} task(s){packed}", job=jobs)

    def chain(self, resume_dir: Path | None, count: int) -> SubmitResult:
        job, run_dir = self.one(self.spec, resume_dir)
        ids = [str(job.job_id)]
        for _ in range(count - 1):
            dependency = {**self.spec.slurm.extra_sbatch, "dependency": f"afterany:{ids[-1]}"}
            follow = dataclasses.replace(self.spec, slurm=dataclasses.replace(self.spec.slurm, extra_sbatch=dependency))
            ids.append(str(self.one(follow, run_dir)[0].job_id))
        note = f"chain of {count} jobs: {', '.join(ids)} (each resumes {run_dir})" if count > 1 else ""
        return SubmitResult(job_id=ids[0], run_name=f"{self.spec.name}/{run_dir.name}", run_dir=str(run_dir),
                            cluster="slurm", tasks=tuple(ids) if count > 1 else (), run_dirs=(str(run_dir),),
                            note=note, job=job)

    def abandon(self) -> None:
        """Cancel what this submission queued and remove what it created."""
        for job_id in self.queued:
            try:
                slurm_cli.cancel(job_id)
            except HpcTrainError as exc:  # said, never swallowed: the job may still run
                print(f"warning: job {job_id} of this submission could not be cancelled: {exc}", file=sys.stderr)
        self.created.undo()


def queue(resolved: Resolved, *, cwd: Path | None = None, interpreter: str | None = None,
          max_parallel: int | None = None, resume_dir: Path | None = None, chain: int = 1,
          snapshot: dict[str, str] | None = None) -> SubmitResult:
    """Queue a job on Slurm and return at once; a refused job leaves nothing queued and nothing written.

    ``resolved.sweep``: job arrays, a task (and run directory) per point. ``resume_dir``: continue that run
    directory in a new job. ``chain``: queue that many jobs, each starting after the previous one ended
    (``afterany``) and resuming the same run directory — for sites without requeue. ``snapshot``: the code
    snapshot's files, written into each new run directory.
    """
    submission = _SlurmSubmission(resolved, cwd, interpreter, snapshot)
    try:
        return submission.array(max_parallel) if submission.sweep else submission.chain(resume_dir, chain)
    except BaseException:
        submission.abandon()
        raise
