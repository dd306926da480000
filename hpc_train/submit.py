"""Submitting jobs (Slurm through submitit, or local processes), sweeps, resume/chain, preflight, and
the run registry behind ``status`` / ``logs`` / ``cancel``.

A run directory is keyed on the job id: ``<runs_root>/<name>/<job id>`` (array task: ``<id>_<task>``;
local runs: ``local-<stamp>-<pid>``). ``submit`` writes into it the rendered script (``job.sbatch``), the
resolved config (``config.json``) and ``run.json`` (job id, name, cluster, time, package version, git
SHA, where the logs are); the job itself adds ``job.yaml``, ``logs/``, ``metrics.jsonl``, checkpoints.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence

from . import __version__
from . import slurm as slurm_cli
from .config import JobSpec, JobSources, dump_yaml
from .errors import ConfigError, JobFailedError, SubmitError
from .render import LaunchSpec, render_sbatch

Cluster = Literal["auto", "slurm", "local"]


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    run_name: str
    """``<name>/<run id>``: what ``status``/``logs``/``cancel`` accept (a job id works too)."""
    run_dir: str
    cluster: Literal["slurm", "local"]
    note: str = ""
    """Anything the user should know (e.g. 'Slurm not found: running locally')."""
    tasks: tuple[str, ...] = ()
    """Array task ids (``<id>_<i>``) of a sweep, or the job ids of a chain."""
    job: Any = field(default=None, repr=False, compare=False)
    """The submitit job handle(s) (not serialised)."""


# ------------------------------------------------------------------------------------------------
# Small pure helpers
# ------------------------------------------------------------------------------------------------


def resolve_python(spec: JobSpec, interpreter: str | None = None) -> str:
    """The interpreter the ranks run: explicit > activated venv/conda (``python``) > container
    (``python3``, the host's path means nothing inside) > the one running hpc-train."""
    s = spec.slurm
    if s.python:
        return s.python
    if s.venv or s.conda_env:
        return "python"
    if s.container is not None:
        return "python3"
    return interpreter or sys.executable


def runs_root(spec: JobSpec, cwd: Path | None = None) -> Path:
    root = Path(os.path.expanduser(spec.runs_dir))
    return root if root.is_absolute() else (cwd or Path.cwd()) / root


def submitit_folder(spec: JobSpec, cwd: Path | None = None) -> Path:
    """submitit's pickles and logs for this job name (on a shared filesystem, like the runs)."""
    return runs_root(spec, cwd) / spec.name / ".submitit"


def choose_cluster(requested: Cluster, spec: JobSpec) -> tuple[Literal["slurm", "local"], str]:
    """``auto``: Slurm when ``sbatch`` is on PATH, else local (said plainly)."""
    if requested == "slurm":
        if shutil.which("sbatch") is None:
            raise SubmitError("--cluster slurm but 'sbatch' is not on PATH; run on a login node, "
                              "or use --cluster local to run here")
        return "slurm", ""
    if requested == "auto" and shutil.which("sbatch") is not None:
        return "slurm", ""
    note = "" if requested == "local" else "Slurm not found (no 'sbatch' on PATH): running locally on this machine"
    if spec.slurm.nodes > 1:
        why = "--cluster local" if requested == "local" else "Slurm is not available"
        raise ConfigError(f"{spec.slurm.nodes} nodes requested but {why}; a local run uses one node: "
                          "use --nodes 1, or submit from a Slurm login node")
    return "local", note


def shared_filesystem_warning(path: Path) -> str | None:
    """A hint when the run directory is obviously node-local (compute nodes could not see it)."""
    text = str(path.resolve())
    for local in ("/tmp", "/var/tmp", "/dev/shm"):
        if text == local or text.startswith(local + "/"):
            return f"runs directory {text} looks node-local; compute nodes must see it (use home or project space)"
    return None


def git_sha(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _submitit_command(python: str, folder: Path) -> str:
    return " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


# ------------------------------------------------------------------------------------------------
# Rendering for submission
# ------------------------------------------------------------------------------------------------


def _array_range(count: int, max_parallel: int | None) -> str:
    return f"0-{count - 1}%{min(count, max_parallel or count)}"


def render_plain(spec: JobSpec, sources: JobSources, *, cwd: Path | None = None, interpreter: str | None = None,
                 sweep: Sequence[JobSpec] = (), max_parallel: int | None = None) -> str:
    """The self-contained script ``hpc-train render`` prints (admins ``sbatch`` it by hand)."""
    launch = LaunchSpec()
    if sweep:
        launch = LaunchSpec(stdout="slurm-%x-%A_%a.out", stderr="slurm-%x-%A_%a.out",
                            array=_array_range(len(sweep), max_parallel))
    return render_sbatch(spec, runs_root=str(runs_root(spec, cwd)), python=resolve_python(spec, interpreter),
                         launch=launch, site_dirs=sources.template_dirs, array_specs=sweep)


def with_site_gpu_flag(spec: JobSpec) -> JobSpec:
    """When the site has not chosen ``slurm.gpu_flag``, let the reachable Slurm's version choose."""
    if spec.slurm.gpu_flag is not None or spec.slurm.gpus_per_node == 0:
        return spec
    flag = slurm_cli.gpu_flag_for(slurm_cli.version())
    return dataclasses.replace(spec, slurm=dataclasses.replace(spec.slurm, gpu_flag=flag))


def dry_run_script(spec: JobSpec, sources: JobSources, *, cwd: Path | None = None, interpreter: str | None = None,
                   sweep: Sequence[JobSpec] = (), max_parallel: int | None = None,
                   resume_dir: Path | None = None) -> str:
    """The script ``submit`` would hand to sbatch (submitit form), written nowhere."""
    from .submitit_hook import submitit_launch  # submitit is imported only when submitting

    folder = submitit_folder(spec, cwd)
    python = resolve_python(spec, interpreter)
    launch = submitit_launch(folder, _submitit_command(python, folder), map_count=len(sweep) or None,
                             array_parallelism=max_parallel)
    launch = dataclasses.replace(launch, run_dir=str(resume_dir) if resume_dir else None)
    return render_sbatch(spec, runs_root=str(runs_root(spec, cwd)), python=python, launch=launch,
                         site_dirs=sources.template_dirs, array_specs=sweep)


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


# ------------------------------------------------------------------------------------------------
# Submission
# ------------------------------------------------------------------------------------------------


def write_run_files(run_dir: Path, spec: JobSpec, sources: JobSources, *, job_id: str, cluster: str,
                    script: str | None, logs: Mapping[str, str], extra: Mapping[str, Any] | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if script is not None:
        (run_dir / "job.sbatch").write_text(script, encoding="utf-8")
    (run_dir / "config.json").write_text(json.dumps(spec.to_dict(), indent=2) + "\n", encoding="utf-8")
    record = {
        "job_id": job_id,
        "name": spec.name,
        "run_name": f"{spec.name}/{run_dir.name}",
        "run_dir": str(run_dir),
        "cluster": cluster,
        "submitted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "submit_host": socket.gethostname(),
        "submit_dir": str(Path.cwd()),
        "hpc_train_version": __version__,
        "git_sha": git_sha(Path.cwd()),
        "job_file": str(sources.job_file) if sources.job_file else None,
        "site_file": str(sources.site_file) if sources.site_file else None,
        "nodes": spec.slurm.nodes,
        "ranks_per_node": spec.slurm.ranks_per_node,
        "world_size": spec.slurm.world_size,
        "logs": dict(logs),
        **(extra or {}),
    }
    (run_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _submitit_logs(folder: Path, job_id: str) -> dict[str, str]:
    """Where submitit's form writes: the batch shell and rank 0 share ``<id>_0_log.*``."""
    return {"batch": str(folder / f"{job_id}_0_log.err"),
            "rank_out": str(folder / f"{job_id}_{{rank}}_log.out"),
            "rank_err": str(folder / f"{job_id}_{{rank}}_log.err")}


def _train_job(spec: JobSpec, run_dir: str | None):
    # torch-free to import and unpickle; the training code is imported when the callable runs.
    from .train.callable import TorchrunJob, TrainJob

    job_class = TorchrunJob if spec.slurm.launcher == "torchrun" else TrainJob
    return job_class(dump_yaml(spec), run_dir or "")


def submit(spec: JobSpec, sources: JobSources, *, cluster: Cluster = "auto", cwd: Path | None = None,
           interpreter: str | None = None, sweep: Sequence[JobSpec] = (), max_parallel: int | None = None,
           resume_dir: Path | None = None, chain: int = 1) -> SubmitResult:
    """Submit and return at once; :func:`wait_for` follows the job to its end.

    ``sweep``: one Slurm job array, a task (and run directory) per spec. ``resume_dir``: continue that
    run directory in a new job. ``chain``: queue that many jobs, each starting after the previous one
    ended (``afterany``) and resuming the same run directory — for sites without requeue.
    """
    chosen, note = choose_cluster(cluster, spec)
    if chosen == "local":
        if sweep or chain > 1 or resume_dir:
            raise ConfigError("--sweep, --chain and --resume need Slurm; run them from a Slurm login node")
        return _submit_local(spec, sources, cwd=cwd, note=note)
    spec = with_site_gpu_flag(spec)
    sweep = [with_site_gpu_flag(s) for s in sweep]
    if sweep:
        return _submit_array(spec, sources, sweep, max_parallel=max_parallel, cwd=cwd, interpreter=interpreter)
    first = _submit_slurm(spec, sources, cwd=cwd, interpreter=interpreter, resume_dir=resume_dir)
    if chain <= 1:
        return first
    ids = [first.job_id]
    run_dir = Path(first.run_dir)
    for _ in range(chain - 1):
        dependency = {**spec.slurm.extra_sbatch, "dependency": f"afterany:{ids[-1]}"}
        follow = dataclasses.replace(spec, slurm=dataclasses.replace(spec.slurm, extra_sbatch=dependency))
        ids.append(_submit_slurm(follow, sources, cwd=cwd, interpreter=interpreter, resume_dir=run_dir).job_id)
    return dataclasses.replace(first, tasks=tuple(ids),
                               note=f"chain of {chain} jobs: {', '.join(ids)} (each resumes {run_dir})")


def _executor(spec: JobSpec, sources: JobSources, cwd: Path | None, interpreter: str | None,
              resume_dir: Path | None = None, sweep: Sequence[JobSpec] = ()):
    from .submitit_hook import TemplateSlurmExecutor

    return TemplateSlurmExecutor(submitit_folder(spec, cwd), spec, runs_root=str(runs_root(spec, cwd)),
                                 python=resolve_python(spec, interpreter), site_dirs=sources.template_dirs,
                                 run_dir=str(resume_dir) if resume_dir else None, array_specs=sweep)


def _sbatch_refused(exc: Exception) -> SubmitError:
    text = getattr(exc, "output", None) or getattr(exc, "stderr", None) or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return SubmitError(f"sbatch refused the job: {slurm_cli.slurm_message(str(text))}")


def _submit_slurm(spec: JobSpec, sources: JobSources, *, cwd: Path | None, interpreter: str | None,
                  resume_dir: Path | None = None) -> SubmitResult:
    executor = _executor(spec, sources, cwd, interpreter, resume_dir)
    try:
        job = executor.submit(_train_job(spec, None))
    except Exception as exc:  # submitit wraps sbatch's refusal (FailedSubmissionError, CalledProcessError)
        raise _sbatch_refused(exc) from None
    job_id = str(job.job_id)
    run_dir = resume_dir or runs_root(spec, cwd) / spec.name / job_id
    script = Path(job.paths.submission_file).read_text(encoding="utf-8")
    folder = submitit_folder(spec, cwd)
    if resume_dir is None:
        write_run_files(run_dir, spec, sources, job_id=job_id, cluster="slurm", script=script,
                        logs=_submitit_logs(folder, job_id), extra={"submitit_folder": str(folder)})
    else:  # a continuation (--resume, --chain): note the new job in the run's record
        (run_dir / f"job-{job_id}.sbatch").write_text(script, encoding="utf-8")
        _append_job(run_dir, job_id, _submitit_logs(folder, job_id))
    return SubmitResult(job_id=job_id, run_name=f"{spec.name}/{run_dir.name}", run_dir=str(run_dir),
                        cluster="slurm", job=job)


def _append_job(run_dir: Path, job_id: str, logs: Mapping[str, str]) -> None:
    path = run_dir / "run.json"
    record = json.loads(path.read_text()) if path.exists() else {"run_dir": str(run_dir)}
    record.setdefault("continued_by", []).append({"job_id": job_id, "logs": dict(logs)})
    record["job_id"], record["logs"] = job_id, dict(logs)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _submit_array(spec: JobSpec, sources: JobSources, sweep: Sequence[JobSpec], *, max_parallel: int | None,
                  cwd: Path | None, interpreter: str | None) -> SubmitResult:
    executor = _executor(spec, sources, cwd, interpreter, sweep=sweep)
    if max_parallel:
        executor.update_parameters(array_parallelism=max_parallel)
    jobs = []
    try:
        with executor.batch():
            for task_spec in sweep:
                jobs.append(executor.submit(_train_job(task_spec, None)))
    except Exception as exc:
        raise _sbatch_refused(exc) from None
    array_id = str(jobs[0].job_id).split("_")[0]
    folder = submitit_folder(spec, cwd)
    script = Path(jobs[0].paths.submission_file).read_text(encoding="utf-8")
    task_ids = []
    for task_spec, job in zip(sweep, jobs):
        task_id = str(job.job_id)
        task_ids.append(task_id)
        write_run_files(runs_root(spec, cwd) / spec.name / task_id, task_spec, sources, job_id=task_id,
                        cluster="slurm", script=script, logs=_submitit_logs(folder, task_id),
                        extra={"submitit_folder": str(folder), "array_job_id": array_id})
    return SubmitResult(job_id=array_id, run_name=f"{spec.name}/{array_id}_*",
                        run_dir=str(runs_root(spec, cwd) / spec.name), cluster="slurm", tasks=tuple(task_ids),
                        note=f"job array {array_id}: {len(task_ids)} task(s)", job=jobs)


def _submit_local(spec: JobSpec, sources: JobSources, *, cwd: Path | None, note: str) -> SubmitResult:
    import submitit

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"local-{stamp}-{os.getpid()}"
    run_dir = runs_root(spec, cwd) / spec.name / run_id
    folder = submitit_folder(spec, cwd)
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(
        tasks_per_node=spec.slurm.ranks_per_node,
        timeout_min=spec.slurm.time_min,
        visible_gpus=tuple(range(spec.slurm.gpus_per_node)),
        signal_delay_s=spec.slurm.signal_delay_s,
    )
    # Every local rank inherits this environment: a free port chosen now cannot collide.
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    job = executor.submit(_train_job(spec, str(run_dir)))
    job_id = str(job.job_id)
    write_run_files(run_dir, spec, sources, job_id=job_id, cluster="local", script=None,
                    logs=_submitit_logs(folder, job_id), extra={"submitit_folder": str(folder)})
    return SubmitResult(job_id=job_id, run_name=f"{spec.name}/{run_id}", run_dir=str(run_dir), cluster="local",
                        note=note, job=job)


_ACTIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
                  "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT")


def final_slurm_state(job_id: str, timeout_s: float = 60.0) -> slurm_cli.JobState:
    """Slurm's verdict once the job has left the queue (sacct lags a second or two behind squeue)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = slurm_cli.job_state(job_id)
        if state.state not in _ACTIVE_STATES and state.state != "UNKNOWN":
            return state
        if time.monotonic() > deadline:
            return state
        time.sleep(1.0)


def wait_for(result: SubmitResult) -> list[Any]:
    """Block until the job (every task of an array) ends; JobFailedError saying why when one failed.

    submitit's result pickle says what rank 0's callable returned; Slurm has the last word (a rank that
    crashes after rank 0 finished still fails the job), so a Slurm job must also end COMPLETED."""
    jobs = result.job if isinstance(result.job, list) else [result.job]
    outcomes = []
    for job in jobs:
        job_id = str(job.job_id)
        hint = f"see `hpc-train status {job_id}` and `hpc-train logs {job_id}`"
        try:
            outcomes.append(job.results())
        except Exception as exc:
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            reason = lines[-1].strip() if lines else type(exc).__name__
            raise JobFailedError(f"job {job_id} ({result.run_name}) failed: {reason}; {hint}") from None
        if result.cluster == "slurm":
            final = final_slurm_state(job_id)
            if final.state != "COMPLETED":
                raise JobFailedError(f"job {job_id} ({result.run_name}) ended {final.state}"
                                     f"{' (exit ' + final.exit_code + ')' if final.exit_code else ''} although "
                                     f"rank 0 returned; {hint}")
    return outcomes


def stream_rank0(result: SubmitResult, echo: Any, poll_s: float = 0.5) -> None:
    """Print rank 0's log lines as they come, until the job has finished (``--wait``)."""
    if isinstance(result.job, list):  # an array: too many streams to interleave; wait_for reports
        return
    run = load_run(Path(result.run_dir))
    for line in follow_logs(run, 0, follow=True, poll_s=poll_s, is_done=result.job.done, prefix=False):
        if not line.startswith("submitit INFO"):
            echo(line)


def result_json(result: SubmitResult) -> str:
    return json.dumps({k: getattr(result, k) for k in ("job_id", "run_name", "run_dir", "cluster", "note", "tasks")})


# ------------------------------------------------------------------------------------------------
# Run registry: status / logs / cancel
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    run_dir: Path
    record: Mapping[str, Any]

    @property
    def job_id(self) -> str:
        return str(self.record.get("job_id") or self.run_dir.name)

    @property
    def name(self) -> str:
        return f"{self.run_dir.parent.name}/{self.run_dir.name}"

    @property
    def cluster(self) -> str:
        return str(self.record.get("cluster", "slurm"))


def load_run(run_dir: Path) -> Run:
    path = run_dir / "run.json"
    record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if not record:  # a plain `sbatch` of a rendered script: the directory layout says it all
        record = {"job_id": run_dir.name, "cluster": "slurm",
                  "logs": {"batch": str(run_dir / "logs/batch.log"), "rank_out": str(run_dir / "logs/rank-{rank}.log")}}
    return Run(run_dir=run_dir, record=record)


def find_runs(root: Path) -> list[Run]:
    """Every run directory under ``root`` (``<name>/<run id>`` holding run.json or job.yaml)."""
    runs = []
    if root.is_dir():
        for group in sorted(root.iterdir()):
            if not group.is_dir() or group.name.startswith("."):
                continue
            for run_dir in sorted(group.iterdir()):
                if run_dir.is_dir() and ((run_dir / "run.json").exists() or (run_dir / "job.yaml").exists()):
                    runs.append(load_run(run_dir))
    return sorted(runs, key=lambda r: (r.run_dir.stat().st_mtime, r.name))


def resolve_run(ref: str, root: Path) -> Run:
    """A run by path, ``name/run id``, job id (``4242``, ``4242_1``) or job name (its latest run)."""
    path = Path(ref)
    if path.is_dir() and ((path / "run.json").exists() or (path / "job.yaml").exists()):
        return load_run(path)
    runs = find_runs(root)
    for matcher in (lambda r: r.name == ref, lambda r: r.job_id == ref or r.run_dir.name == ref,
                    lambda r: r.run_dir.parent.name == ref):
        matches = [r for r in runs if matcher(r)]
        if matches:
            return matches[-1]
    known = ", ".join(r.name for r in runs[-5:]) or "none"
    raise ConfigError(f"no run {ref!r} under {root}; recent runs: {known} (or pass --runs-dir)")


def _local_state(run: Run) -> str:
    """A local run's state from submitit's result pickle (success/error) or its controller process."""
    folder = Path(run.record.get("submitit_folder", ""))
    result = folder / f"{run.job_id}_0_result.pkl"
    if result.exists():
        import pickle

        try:
            with result.open("rb") as handle:
                outcome = pickle.load(handle)[0]
        except Exception:
            return "UNKNOWN"
        return "COMPLETED" if outcome == "success" else "FAILED"
    try:
        os.kill(int(run.job_id), 0)
        return "RUNNING"
    except (ValueError, ProcessLookupError, PermissionError):
        return "FAILED"


_SRUN_TASK_ERROR = re.compile(r"srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,-]+): (?P<what>.+)")


def first_failure(run: Run) -> str | None:
    """The first rank that failed and its host, as srun reported it in the batch log
    (``srun: error: gpu02: task 3: Exited with exit code 1``)."""
    batch = run.record.get("logs", {}).get("batch")
    candidates = [Path(batch)] if batch else []
    if batch and batch.endswith(".err"):
        candidates.append(Path(batch[:-4] + ".out"))
    for path in candidates:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = _SRUN_TASK_ERROR.search(line)
            if m and "Killed" not in m.group("what") and "terminated" not in m.group("what").lower():
                tasks = m.group("tasks")
                return f"rank {tasks} on {m.group('host')}: {m.group('what').strip()}"
    return None


def _progress(run_dir: Path) -> dict[str, Any]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return {}
    last = None
    for line in metrics.read_text().splitlines():
        if line.strip():
            try:
                last = json.loads(line)
            except json.JSONDecodeError:
                continue
    if not last:
        return {}
    keep = ("epoch", "global_step", "top1", "balanced", "many", "medium", "few")
    return {k: round(last[k], 4) if isinstance(last[k], float) else last[k] for k in keep if k in last}


def _trainer_state(run_dir: Path) -> str | None:
    """What the trainer last wrote in status.json (running, completed, preempted, requeued, failed)."""
    try:
        return json.loads((run_dir / "status.json").read_text()).get("state")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None


def run_status(run: Run) -> dict[str, Any]:
    if run.cluster == "local":
        state: dict[str, Any] = {"state": _local_state(run), "source": "local"}
    else:
        js = slurm_cli.job_state(run.job_id)
        state = {"state": js.state, "reason": js.reason, "elapsed": js.elapsed, "nodes": js.nodes,
                 "exit_code": js.exit_code, "source": js.source}
    out = {"run": run.name, "job_id": run.job_id, "cluster": run.cluster, "run_dir": str(run.run_dir), **state}
    if state["state"] in ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "TIMEOUT"):
        failure = first_failure(run)
        if failure:
            out["first_failure"] = failure
    progress = _progress(run.run_dir)
    if progress:
        out["progress"] = progress
    trainer = _trainer_state(run.run_dir)
    if trainer:
        out["train_state"] = trainer
        if trainer == "preempted" and out["state"] not in _ACTIVE_STATES:
            out["hint"] = f"checkpointed, not requeued: hpc-train submit --resume {run.name}"
    return {k: v for k, v in out.items() if v not in ("", None)}


def log_files(run: Run, rank: int | None = None) -> list[tuple[str, Path]]:
    """(label, path) of a run's logs: the batch log, then each rank's (or only ``rank``'s)."""
    logs = run.record.get("logs", {})
    files: list[tuple[str, Path]] = []
    if rank is None and logs.get("batch"):
        files.append(("batch", Path(logs["batch"])))
    world = int(run.record.get("world_size") or 0)
    ranks = [rank] if rank is not None else list(range(world))
    if rank is None and not world:  # a plain sbatch run: take the rank logs that exist
        pattern = Path(logs.get("rank_out", str(run.run_dir / "logs/rank-{rank}.log")))
        ranks = sorted(int(m.group(1)) for p in pattern.parent.glob("*")
                       if (m := re.fullmatch(re.escape(pattern.name).replace(r"\{rank\}", r"(\d+)"), p.name)))
    for r in ranks:
        for key in ("rank_err", "rank_out"):  # progress (stderr) before the final table (stdout)
            if logs.get(key):
                path = Path(logs[key].format(rank=r))
                if rank is None and r == 0 and logs.get("batch") and path == Path(logs["batch"]):
                    continue  # submitit's form: rank 0 shares the batch log
                files.append((f"rank {r}", path))
    return files


def follow_logs(run: Run, rank: int | None, *, follow: bool, poll_s: float = 1.0,
                is_done: Any = None, prefix: bool = True) -> Iterator[str]:
    """Lines of the run's logs, each prefixed with its source; with ``follow``, keep reading until
    the job has ended and no new lines arrive."""
    files = log_files(run, rank)
    offsets = {path: 0 for _, path in files}
    while True:
        new = False
        for label, path in files:
            if not path.exists():
                continue
            with path.open("r", errors="replace") as handle:
                handle.seek(offsets[path])
                chunk = handle.read()
                offsets[path] = handle.tell()
            for line in chunk.splitlines():
                new = True
                yield f"[{label}] {line}" if prefix else line
        if not follow:
            return
        if not new and is_done is not None and is_done():
            return
        time.sleep(poll_s)


def job_is_over(run: Run) -> bool:
    return run_status(run)["state"] not in _ACTIVE_STATES


def cancel_run(run: Run) -> str:
    if run.cluster == "local":
        try:
            os.kill(int(run.job_id), 15)
        except (ValueError, ProcessLookupError):
            return f"{run.name}: local job {run.job_id} is not running"
        return f"cancelled {run.name} (local job {run.job_id})"
    slurm_cli.cancel(run.job_id)
    return f"cancelled {run.name} (job {run.job_id})"


def continued_spec(run: Run) -> Path:
    """The job file a ``--resume`` starts from: the run's own resolved config."""
    for candidate in (run.run_dir / "job.yaml", run.run_dir / "config.json"):  # JSON is YAML
        if candidate.exists():
            return candidate
    raise ConfigError(f"{run.run_dir} has neither job.yaml nor config.json; cannot resume it")
