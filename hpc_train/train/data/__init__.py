"""Data on the rank: data sets (datasets, file_sets), batches (file_batches, pipeline) and
the DDP-aware samplers (samplers).
"""
