"""Checkpoints: the file format (checkpoint), capture/write/restore (checkpointer) and the best held-out model
(best_held_out).
"""
