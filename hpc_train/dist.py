"""Public path of the rank mapping for your own code (``from hpc_train.dist import setup``) and of the progress
heartbeat (``from hpc_train.dist import heartbeat``, docs/commands.md); the code is :mod:`hpc_train.rank.dist`
and :mod:`hpc_train.rank.heartbeat`. Torch-free to import."""

from .rank.dist import (DEFAULT_PORT_BASE, DEFAULT_PORT_SPAN, DistEnv, DistError, catch_preemption, init_process_group,
                        launch_info, leave, master_port_for, setup, simulate, stop_requested, teardown,
                        visible_gpu_count)
from .rank.heartbeat import heartbeat

__all__ = ["DEFAULT_PORT_BASE", "DEFAULT_PORT_SPAN", "DistEnv", "DistError", "catch_preemption", "heartbeat",
           "init_process_group", "launch_info", "leave", "master_port_for", "setup", "simulate", "stop_requested",
           "teardown", "visible_gpu_count"]
