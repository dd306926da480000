"""Slurm, the local backend's sibling: its client commands and what their output means (client), queueing jobs,
arrays and chains through submitit (queue), the batch script's watchdog (watchdog), and the one coupling to
submitit's internals (submitit_hook, the only module that imports submitit at import time).
"""
