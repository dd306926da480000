"""Public path of the user-command wrapper: rendered sbatch scripts and the local launcher run
``python -m hpc_train.command --resolved JOB.yaml``. The code is :mod:`hpc_train.rank.command`."""

import sys

from .rank.command import main

if __name__ == "__main__":
    sys.exit(main())
