"""What a training run reports of itself: evaluation, metrics, the progress lines and end-of-run summary
(progress), the heartbeat and compute times (pulse, stragglers) and TensorBoard event files (tensorboard).
"""
