"""The run directory and everything read from it: its files and states (rundir), finding runs
(index), status/logs/cancel (status), the sweep report (report), and what a submission writes
into it (submission, undo). Torch-free and submitit-free.
"""
