"""What a run reports: evaluation, metrics, the end-of-run report (report) and
TensorBoard event files (tensorboard).
"""
