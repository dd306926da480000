"""One rank of the agreement-timeout check (run by test_agreement_timeout.py, not collected): rank 1 never joins
the ranks' agreement; rank 0 must give up after ``train.process_group_timeout_s``, not torch's 30-minute default."""

from __future__ import annotations

import sys
import time

import torch

from hpc_train.rank.dist import DistEnv, init_process_group
from hpc_train.train.loop.control import Agreement, Flags

TIMEOUT_S = 3


def main() -> None:
    torch.set_num_threads(1)
    env = DistEnv.from_environ()
    init_process_group(env, backend="gloo", timeout_s=TIMEOUT_S)
    agreement = Agreement(True, timeout_s=TIMEOUT_S)
    if env.rank == 1:
        time.sleep(float(sys.argv[1]))  # stopped: never reaches the agreement
        return
    start = time.monotonic()
    try:
        agreement.now(Flags())
    except RuntimeError as exc:
        print(f"gave up after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        sys.stdout.flush()
        import os
        os._exit(0)
    print("agreed", flush=True)


if __name__ == "__main__":
    main()
