"""Stage 1's best model on the held-out split, kept as its own snapshot: what stage 2 and τ-normalisation start
from when there is a held-out split (classifier-balancing's stage 2 loads stage 1's best checkpoint on val).

It is written (by rank 0, in the background, like a checkpoint) whenever the held-out metric improves, whatever
the checkpoint cadence, to ``checkpoints/best-heldout.pt`` (:data:`~.checkpoint.BEST_HELD_OUT`) with its
evaluation record. Never chosen on test: without a held-out split there is none, and stage 2 starts from the
end of stage 1.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from . import checkpoint as ckpt
from .checkpointer import Checkpointer

log = logging.getLogger("hpc_train.train")


class BestHeldOut:
    """The snapshot of one run directory; ``barrier``: all ranks wait for each other (before reading)."""

    def __init__(self, run_dir: Path, checkpointer: Checkpointer, barrier: Callable[[], None], *,
                 is_main: bool) -> None:
        self.run_dir, self.checkpointer, self.barrier, self.is_main = run_dir, checkpointer, barrier, is_main
        self.path = ckpt.best_held_out_path(run_dir)

    def save(self, record: dict[str, Any], model: nn.Module) -> None:
        """Stage 1 improved on the held-out split: its model (BatchNorm buffers included) and ``record``."""
        self.checkpointer.save_snapshot({"format": ckpt.FORMAT_VERSION, "record": record,
                                         "model": model.state_dict()}, self.path)

    def weights(self, device: torch.device) -> dict[str, Any]:
        """The snapshot's model state, on every rank once rank 0's write is on disk."""
        self.checkpointer.wait()
        self.barrier()
        found = ckpt.load_best_held_out(self.run_dir, map_location=device)
        if found is None:
            raise RuntimeError(f"no {self.path.name} in {self.path.parent}, though stage 1 was evaluated on the "
                               "held-out split")
        if self.is_main:
            r = found["record"]
            log.info("stage 1 for stage 2 and tau-normalisation: epoch %d, the best on the held-out split "
                     "(balanced %.2f)", r["epoch"], 100 * r["val"]["balanced"])
        return found["model"]

    def record_on_disk(self) -> dict[str, Any] | None:
        """The snapshot's record, the best held-out evaluation so far — evaluations after the newest checkpoint
        included (a run that crashed after writing it): on resume, the one to beat."""
        found = ckpt.load_best_held_out(self.run_dir)
        return None if found is None else found["record"]
