"""Public path of the submitit callables: jobs queued by earlier versions hold pickles that name
``hpc_train.train.callable.TrainJob`` (and ``CommandJob``, ``TorchrunJob``). Torch-free; the code is
:mod:`hpc_train.rank.callable`."""

from ..rank.callable import CommandJob, TorchrunJob, TrainJob

__all__ = ["CommandJob", "TorchrunJob", "TrainJob"]
