"""Submitting a job (Slurm through submitit, or local processes) and the run registry.

A run directory is keyed on the job id: ``<runs_root>/<name>/<job id>`` (local runs: ``local-<stamp>``).
``submit`` writes into it the rendered script (``job.sbatch``), the resolved config (``config.json``)
and ``run.json`` (job id, name, cluster, time, package version, git SHA); the job itself adds
``job.yaml``, ``logs/``, ``metrics.jsonl``, checkpoints.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import __version__
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
    job: Any = field(default=None, repr=False, compare=False)
    """The submitit job handle (not serialised)."""


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
        raise ConfigError(f"{spec.slurm.nodes} nodes requested but {'--cluster local' if requested == 'local' else 'Slurm is not available'}; "
                          "a local run uses one node: use --nodes 1, or submit from a Slurm login node")
    return "local", note


def git_sha(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def write_run_files(run_dir: Path, spec: JobSpec, sources: JobSources, *, job_id: str, cluster: str,
                    script: str | None, extra: dict[str, Any] | None = None) -> None:
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
        **(extra or {}),
    }
    (run_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def submitit_folder(spec: JobSpec, cwd: Path | None = None) -> Path:
    """submitit's pickles and logs for this job name (on a shared filesystem, like the runs)."""
    return runs_root(spec, cwd) / spec.name / ".submitit"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dry_run_script(spec: JobSpec, sources: JobSources, *, cwd: Path | None = None,
                   interpreter: str | None = None) -> str:
    """The script ``submit`` would hand to sbatch (submitit form), written nowhere."""
    from .submitit_hook import submitit_launch  # submitit is imported only when submitting

    folder = submitit_folder(spec, cwd)
    python = resolve_python(spec, interpreter)
    command = " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return render_sbatch(spec, runs_root=str(runs_root(spec, cwd)), python=python,
                         launch=submitit_launch(folder, command), site_dirs=sources.template_dirs)


def submit(spec: JobSpec, sources: JobSources, *, cluster: Cluster = "auto", cwd: Path | None = None,
           interpreter: str | None = None) -> SubmitResult:
    """Submit ``spec`` and return at once; :func:`wait_for` follows the job to its end."""
    chosen, note = choose_cluster(cluster, spec)
    if chosen == "local":
        return _submit_local(spec, sources, cwd=cwd, note=note)
    return _submit_slurm(spec, sources, cwd=cwd, interpreter=interpreter)


def _train_job(spec: JobSpec, run_dir: str | None):
    from .train.callable import TrainJob  # torch-free; training code is imported when it runs

    return TrainJob(dump_yaml(spec), run_dir)


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
    write_run_files(run_dir, spec, sources, job_id=str(job.job_id), cluster="local", script=None,
                    extra={"submitit_folder": str(folder), "log_pattern": str(folder / "%j_%t_log.out")})
    return SubmitResult(job_id=str(job.job_id), run_name=f"{spec.name}/{run_id}", run_dir=str(run_dir),
                        cluster="local", note=note, job=job)


def _submit_slurm(spec: JobSpec, sources: JobSources, *, cwd: Path | None,
                  interpreter: str | None) -> SubmitResult:
    from .submitit_hook import TemplateSlurmExecutor

    root = runs_root(spec, cwd)
    folder = submitit_folder(spec, cwd)
    python = resolve_python(spec, interpreter)
    executor = TemplateSlurmExecutor(folder, spec, runs_root=str(root), python=python,
                                     site_dirs=sources.template_dirs)
    try:
        job = executor.submit(_train_job(spec, None))
    except Exception as exc:  # submitit wraps sbatch's refusal in FailedSubmissionError / CalledProcessError
        raise SubmitError(f"sbatch refused the job: {_sbatch_message(exc)}") from None
    run_dir = root / spec.name / str(job.job_id)
    script = Path(job.paths.submission_file).read_text(encoding="utf-8")
    write_run_files(run_dir, spec, sources, job_id=str(job.job_id), cluster="slurm", script=script,
                    extra={"submitit_folder": str(folder), "log_pattern": str(folder / "%j_%t_log.out")})
    return SubmitResult(job_id=str(job.job_id), run_name=f"{spec.name}/{job.job_id}", run_dir=str(run_dir),
                        cluster="slurm", job=job)


def _sbatch_message(exc: Exception) -> str:
    text = str(getattr(exc, "output", b"") or getattr(exc, "stderr", b"") or exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else type(exc).__name__


def wait_for(result: SubmitResult) -> list[Any]:
    """Block until the job ends; its per-task results, or JobFailedError saying why it failed."""
    job = result.job
    try:
        return job.results()
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        reason = lines[-1].strip() if lines else type(exc).__name__
        raise JobFailedError(f"job {result.job_id} ({result.run_name}) failed: {reason}; "
                             f"see `hpc-train logs {result.job_id}`") from None


def result_json(result: SubmitResult) -> str:
    return json.dumps({k: getattr(result, k) for k in ("job_id", "run_name", "run_dir", "cluster", "note")})


def render_plain(spec: JobSpec, sources: JobSources, *, cwd: Path | None = None,
                 interpreter: str | None = None) -> str:
    """The self-contained script ``hpc-train render`` prints (admins ``sbatch`` it by hand)."""
    return render_sbatch(spec, runs_root=str(runs_root(spec, cwd)), python=resolve_python(spec, interpreter),
                         launch=LaunchSpec(), site_dirs=sources.template_dirs)


def shared_filesystem_warning(path: Path) -> str | None:
    """A hint when the run directory is obviously node-local (compute nodes could not see it)."""
    text = str(path.resolve())
    for local in ("/tmp", "/var/tmp", "/dev/shm", "/scratch/local"):
        if text == local or text.startswith(local + "/"):
            return f"runs directory {text} looks node-local; compute nodes must see it (use home or project space)"
    return None
