"""hpc-train: render, submit and run PyTorch DDP long-tail training jobs on Slurm GPU clusters."""

__version__ = "0.1.0"
