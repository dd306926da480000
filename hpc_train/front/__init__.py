"""The cluster-neutral front over the two sibling backends (:mod:`hpc_train.slurm`, :mod:`hpc_train.local`):
submit (choose the cluster, snapshot the code, dispatch to a backend, register the runs), follow a submission to
its end, and the status and cancel side that asks a backend for its view of the jobs before :mod:`hpc_train.runs`
folds it. The backends import neither each other nor the front; the CLI calls the front.
"""
