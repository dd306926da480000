"""``python -m hpc_train.local``: the local runner (:mod:`hpc_train.local.runner`)."""

import sys

from .runner import main

sys.exit(main())
