"""The shared DDP long-tail training entrypoint that every Slurm task runs.

``python -m hpc_train.train JOB.yaml`` (:mod:`hpc_train.train.__main__`), ``hpc-train train JOB``, or
submitit's pickled :class:`hpc_train.train.callable.TrainJob`. This package is the only part of
hpc-train that imports torch, and only its submodules do so: importing ``hpc_train.train``,
``hpc_train.train.callable`` or ``hpc_train.rank.preempt`` stays torch-free, because the preemption
handler has to be in place before the seconds-long torch import (see :mod:`hpc_train.rank.preempt`).
"""
