"""Local runs: the submit side and the plan (submit), the detached runner
(``python -m hpc_train.local``: runner), and running launches on one machine (launcher).
"""
