"""Local runs, the Slurm backend's sibling: the run directories, the plan and the detached runner's start (plan),
the detached runner (``python -m hpc_train.local``: runner), running launches on one machine (launcher), and what
its watchdog does to hung ranks (hang_actions).
"""
