"""Slurm: its client commands and their output (client), submission through submitit (submit),
and the one coupling to submitit's internals (submitit_hook, the only module that imports
submitit at import time).
"""
