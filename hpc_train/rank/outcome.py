"""How one rank's run ended: what :func:`hpc_train.rank.lifecycle.run` returns and the trainer
(:mod:`hpc_train.train.launch`) gives back to it. Its own module so that the trainer, which the lifecycle
imports, need not import the lifecycle back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunOutcome:
    """The rank's exit code (:mod:`hpc_train.runs.rundir`'s), its run directory, the trainer's summary and a
    message for the caller."""

    exit_code: int
    run_dir: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    message: str = ""
