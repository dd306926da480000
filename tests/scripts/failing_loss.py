"""A plug-in loss that fails when it is built: a trainer run that ends (failed) within seconds of its start
(tests/real_cluster/test_array_states.py)."""


def build(**_args):
    raise RuntimeError("this loss fails on purpose")
