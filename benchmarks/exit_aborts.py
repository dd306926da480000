"""How often a finished DDP rank aborts at interpreter exit (issue 27: "terminate called without an active
exception", SIGABRT, exit 134), per client script, at world size 2 on CPU (gloo, env:// rendezvous, the two
ranks started directly: no launcher in between). Not in the default suite: 50 runs per client take minutes.

    .venv/bin/python benchmarks/exit_aborts.py --runs 50 [--clients plain,setup_end,setup_leave] [--json FILE]
    .venv/bin/python benchmarks/exit_aborts.py --runs 50 --clients lightning_default,lightning_leave  # the clients extra

--clients: names of scripts in benchmarks/exit_clients/ (default: all of them; the accelerate and HF Trainer ones
need the `clients` extra).

Prints, per client, how many runs ended with each pair of exit codes; an abort is any rank exiting 134.
Run it with PYTHONPATH=<another checkout> to measure that checkout's hpc_train.dist (the "before" numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

CLIENTS_DIR = Path(__file__).resolve().parent / "exit_clients"
WORLD_SIZE = 2
RUN_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_once(script: Path, workdir: Path) -> tuple[int, ...]:
    """Both ranks of one run; their exit codes as a shell reports them (killed by signal N: 128 + N)."""
    port = str(_free_port())
    procs = []
    for rank in range(WORLD_SIZE):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD_SIZE), "LOCAL_WORLD_SIZE": str(WORLD_SIZE)}
        log = open(workdir / f"rank-{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=workdir), log))
    codes = []
    for proc, log in procs:
        returncode = proc.wait(timeout=RUN_TIMEOUT_S)
        log.close()
        codes.append(returncode if returncode >= 0 else 128 - returncode)
    return tuple(codes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--clients", default=",".join(sorted(p.stem for p in CLIENTS_DIR.glob("*.py"))))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    for client in args.clients.split(","):
        script = CLIENTS_DIR / f"{client}.py"
        outcomes: Counter = Counter()
        aborted_runs = 0
        with tempfile.TemporaryDirectory(prefix=f"exit-aborts-{client}-") as tmp:
            for index in range(args.runs):
                codes = run_once(script, Path(tmp))
                outcomes[" ".join(map(str, codes))] += 1
                aborted_runs += 134 in codes
                print(f"{client} run {index + 1}: exit codes {codes}", flush=True)  # a long loop says where it is
        results[client] = {"runs": args.runs, "aborted_runs": aborted_runs, "exit_codes": dict(outcomes)}
        print(f"{client}: {aborted_runs}/{args.runs} runs aborted (exit codes per run: {dict(outcomes)})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
