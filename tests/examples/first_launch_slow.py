"""``python first_launch_slow.py FIRST_STEP_S EXAMPLE ARGS...``: become ``python EXAMPLE ARGS...`` (exec: the same
pid, the same interpreter, the example unchanged as its own ``__main__``) with ``--step-s FIRST_STEP_S`` on a run's first launch (``HPC_TRAIN_RESTART`` 0, hpc-train's contract)
and ARGS' own ``--step-s`` on the launches after it.

Why: the preemption tests signal the first launch once both ranks step. With the example's own pace the first launch
ran to its end 4-6 s after that, so a test starved for longer (2 busy cores), or a slow ``scancel`` delivery, met a
run that had completed unpreempted. A slow first launch (every step ``FIRST_STEP_S``) leaves the signal minutes, not
seconds, and the resumed launch keeps the quick pace, so the run costs about one slow step more. The interpreter
is the job's (``python`` first, replaced by hpc-train, and exec'd again here).
"""

import os
import sys

first_step_s, example, *args = sys.argv[1:]
if os.environ.get("HPC_TRAIN_RESTART") == "0":
    args += ["--step-s", first_step_s]  # the last --step-s wins (argparse)
os.execv(sys.executable, [sys.executable, example, *args])
