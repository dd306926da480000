"""Public path of the Slurm node-list parser (the sbatch template's fallback for ``MASTER_ADDR`` calls
``hpc_train.hostlist.expand``); the code is :mod:`hpc_train.rank.hostlist`."""

from .rank.hostlist import count, expand, expand_tasks_per_node

__all__ = ["count", "expand", "expand_tasks_per_node"]
