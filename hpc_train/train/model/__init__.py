"""What is trained and how it is scored: models and losses (each with its plug-in
adapter beside its registry), BatchNorm across ranks (batchnorm) and two-stage methods (two_stage).
"""
