"""What a rank process runs before torch, torch-free (no torch, numpy or submitit at import time):
the rank mapping (dist), node lists (hostlist), the lifecycle (lifecycle), preemption
(preempt), the submitit callables (callable) and the user-command wrapper (command).
"""
