"""``python -m hpc_train.cli`` is ``hpc-train``."""

from . import main

main()
