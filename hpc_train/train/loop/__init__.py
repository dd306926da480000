"""The training loop: the Trainer (engine), the step (step), its CUDA graphs (graphs), the
host-sync guard (guard), agreement between ranks (control), the lr schedule (schedule).
"""
