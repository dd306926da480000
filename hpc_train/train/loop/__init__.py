"""The training loop: the Trainer (engine), its epoch boundary (boundary), the step and how a phase's step is
put together (step, with lean and sam), its CUDA graphs (graphs), the host-sync guard (guard), agreement between
ranks (control), the lr schedule and the epoch's rates (schedule).
"""
