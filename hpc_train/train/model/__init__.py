"""What is trained and how it is scored: models, losses, BatchNorm across ranks
(batchnorm), two-stage methods (two_stage) and plug-ins (plugins).
"""
