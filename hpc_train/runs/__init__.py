"""The run directory and everything read from it: its files and states (rundir), finding runs (index), status
and logs folded from it and a scheduler's view of its job (status, scheduler_job), whether it is alive and
advancing (liveness), its bad-node list (bad_nodes), the sweep report (report), and what a submission writes into
it (submission, undo). Torch-free and submitit-free; it imports no backend.
"""
