"""Checkpoints: the file format (checkpoint) and capture/write/restore (snapshots).
"""
