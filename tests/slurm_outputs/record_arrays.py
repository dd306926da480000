"""Record sacct's forms of arrays and of a job that never started, from the running test cluster, with the command
hpc-train runs (``sacct -n -P -X -j IDS -o JobID,State,ExitCode,Elapsed,NodeList,Reason``), asked both by the
array id and by its task ids (``status`` asks by task ids). Run under the cluster lock, the cluster up::

    .venv/bin/python -m tests.slurm_outputs.record_arrays [--suffix -24.11]

Writes ``sacct-array-ended*.txt`` (the first answer right after the array's end, when sacct may still list it
under the bare array id, and the settled one), ``sacct-array-cancelled-pending*.txt`` and
``sacct-cancelled-before-start*.txt`` here, each headed by nothing (the bytes sacct printed); prints the version,
the job ids and each command for the README."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hpc_train.slurm.client import SACCT_FIELDS
from tests.cluster import harness

OUT = Path(__file__).resolve().parent


def sacct(ids: str, env: dict[str, str]) -> str:
    return harness.run_slurm(["sacct", "-n", "-P", "-X", "-j", ids, "-o", SACCT_FIELDS], env=env).stdout


def gone_from_squeue(job_id: str, env: dict[str, str]) -> bool:
    result = harness.run_slurm(["squeue", "-h", "-j", job_id, "-o", "%i"], env=env, check=False)
    return result.returncode != 0 or not result.stdout.strip()


def record(name: str, text: str, command: str) -> None:
    (OUT / name).write_text(text)
    print(f"--- {name}: {command}\n{text}", end="" if text.endswith("\n") else "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suffix", default="", help="added to each file name, e.g. -24.11")
    args = parser.parse_args(argv)
    env = harness.read_cluster_info().env
    print(harness.run_slurm(["sinfo", "--version"], env=env).stdout.strip())
    sx = args.suffix

    # A job cancelled before it started, and an array cancelled while pending (held: none of it ran).
    single = harness.sbatch(["--hold", "--wrap", "true"], env=env)
    pending = harness.sbatch(["--hold", "--array=0-2%2", "--wrap", "true"], env=env)
    # An array whose two tasks ran and failed.
    ended = harness.sbatch(["--array=0-1", "--wrap", "exit 3"], env=env)
    harness.run_slurm(["scancel", single, pending], env=env)
    while not gone_from_squeue(ended, env):
        time.sleep(0.1)
    first = first_tasks = ""
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and f"\n{ended}|" not in "\n" + first:  # the bare-id form, if it shows
        first = sacct(ended, env)  # right after the end: what status sees first
        first_tasks = sacct(f"{ended}_0,{ended}_1", env)
        time.sleep(0.2)
    time.sleep(8)
    pending_tasks = ",".join(f"{pending}_{i}" for i in range(3))
    record(f"sacct-cancelled-before-start{sx}.txt", sacct(single, env), f"sacct ... -j {single}")
    record(f"sacct-array-cancelled-pending{sx}.txt", sacct(pending, env), f"sacct ... -j {pending}")
    record(f"sacct-array-cancelled-pending-tasks{sx}.txt", sacct(pending_tasks, env), f"sacct ... -j {pending_tasks}")
    record(f"sacct-array-ended-first{sx}.txt", first, f"sacct ... -j {ended} (at once)")
    record(f"sacct-array-ended-first-tasks{sx}.txt", first_tasks, f"sacct ... -j {ended}_0,{ended}_1 (at once)")
    record(f"sacct-array-ended{sx}.txt", sacct(ended, env), f"sacct ... -j {ended} (8 s later)")
    record(f"sacct-array-ended-tasks{sx}.txt", sacct(f"{ended}_0,{ended}_1", env), f"sacct ... -j {ended}_0,{ended}_1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
