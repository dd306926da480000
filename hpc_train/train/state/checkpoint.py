"""Atomic checkpoints in the run directory, newest-complete-first resume, corrupt → previous.

A checkpoint is written to a temporary file in the same directory, flushed to disk and renamed over
its final name with ``os.replace`` (atomic on POSIX filesystems, NFS and Lustre included), so a job
killed mid-write leaves the previous checkpoints intact and never a half-written ``ckpt-*.pt``. Only
plain containers, numbers, strings and tensors go in — RNG states too, as tensors — so
``torch.load(weights_only=True)`` reads them without unpickling arbitrary objects.

Names are ``checkpoints/ckpt-<global step, 10 digits>.pt``: the newest is the largest step. Loading tries
the newest and falls back to older ones, with a warning, when a file does not load (a truncated file
from a full disk, a filesystem hiccup). When there are checkpoint files and none of them loads, the run
cannot continue, and never silently starts over: :class:`UnreadableCheckpoints` (exit 2) names them (a
fresh start is a new run, not a fallback).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import HpcTrainError

log = logging.getLogger("hpc_train.train")

_NAME_RE = re.compile(r"^ckpt-(\d{10})\.pt$")
FORMAT_VERSION = 1


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def checkpoint_path(run_dir: Path, global_step: int) -> Path:
    return checkpoint_dir(run_dir) / f"ckpt-{global_step:010d}.pt"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, newest (largest step) first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


class CheckpointWriteError(HpcTrainError):
    """A checkpoint could not be written (a full disk, a quota, a read-only filesystem): the run fails (exit 1)
    naming the file and the reason; the previous checkpoint is intact (the failed write never took its name)."""

    exit_code = 1


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: torch.save reports a failed write as a RuntimeError ("unexpected pos …") whose
    context is the OSError that says why (ENOSPC)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def write_failed(exc: BaseException, path: Path) -> CheckpointWriteError:
    """``no space left on device writing PATH (ENOSPC); …``: the reason the run's state records."""
    cause = _os_error_in(exc)
    if cause is not None and cause.errno:
        why = f"{os.strerror(cause.errno)[:1].lower()}{os.strerror(cause.errno)[1:]}"
        name = f" ({errno.errorcode.get(cause.errno, cause.errno)})"
    else:
        why, name = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", ""
    older = [p.name for p in list_checkpoints(path.parent.parent) if p != path]
    kept = f"the previous checkpoint {older[0]} is intact" if older else "no earlier checkpoint"
    return CheckpointWriteError(f"{why} writing {path}{name}; {kept}: free space there, then hpc-train submit "
                                "--resume RUN")


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` to a temporary file, fsync it, rename it to ``path``: a failed write (a full disk) leaves no
    file under a checkpoint's name and raises :class:`CheckpointWriteError`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        raise write_failed(exc, path) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # what a failed write left: it would keep the disk full
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


class UnreadableCheckpoints(HpcTrainError):
    """A run has checkpoint files and none of them loads: it cannot continue (exit 2, naming them)."""


def why_unreadable(exc: BaseException) -> str:
    """Why a checkpoint did not load, in one line: for torch's weights-only refusal the line that says what the
    file asked for (its advice to load it with ``weights_only=False``, which would run its code, is left out)."""
    text = str(exc)
    if "Weights only load failed" in text:
        noise = ("Weights only load failed", "Please file an issue", "Check the documentation", "WeightsUnpickler error")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(noise)]
        return "not a weights-only checkpoint" + (f" ({lines[0]})" if lines else "")
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


BEST_HELD_OUT = "best-heldout.pt"
"""The model of stage 1's best evaluation on the held-out split (written whenever it improves, whatever the
checkpoint cadence): stage 2 and τ-normalisation start from it. Not a checkpoint: never resumed from, never
pruned."""


def best_held_out_path(run_dir: Path) -> Path:
    return checkpoint_dir(run_dir) / BEST_HELD_OUT


def load_best_held_out(run_dir: Path, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """``{"format", "record", "model"}`` of the best held-out evaluation so far, or None when none was written;
    :class:`UnreadableCheckpoints` when it cannot be read (stage 2 would start from no stage 1)."""
    path = best_held_out_path(run_dir)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
        record = state.get("record") if isinstance(state, dict) else None
        if state.get("format") != FORMAT_VERSION or "model" not in state or not isinstance(record, dict):
            raise ValueError("not an hpc-train snapshot")
        if not {"epoch", "global_step", "val"} <= set(record):
            raise ValueError("its record lacks the epoch, step or held-out evaluation")
    except Exception as exc:  # noqa: BLE001 - any failure to read means the same: it cannot be used
        raise UnreadableCheckpoints(f"{path} cannot be read ({why_unreadable(exc)}); stage 2 and tau-normalisation "
                                    "start from it: restore it, or start a new run (another run directory)") from None
    return state


RESUMED_KEYS = ("model", "optimizer", "phase", "epoch", "step_in_epoch", "global_step")
"""What a checkpoint must hold for a run to continue from it (the trainer's state_dict writes them all)."""


def load_latest(run_dir: Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that loads; older ones are tried (with a warning) when it does not. None when the
    run has no checkpoint; :class:`UnreadableCheckpoints` when it has some and none loads."""
    failures = []
    for path in list_checkpoints(run_dir):
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
            if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION or "model" not in state:
                raise ValueError("not an hpc-train checkpoint")
            missing = [key for key in RESUMED_KEYS if key not in state]
            if missing:
                raise ValueError(f"a checkpoint without {', '.join(missing)}")
            return state, path
        except Exception as exc:  # noqa: BLE001 - any failure to read means: try the previous one
            failures.append(f"{path.name}: {why_unreadable(exc)}")
            log.warning("checkpoint %s is unreadable (%s); trying the previous one", path, why_unreadable(exc))
    if failures:
        shown = "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
        raise UnreadableCheckpoints(
            f"{checkpoint_dir(run_dir)}: none of its {len(failures)} checkpoint(s) can be read ({shown}); the run "
            "cannot continue from them: restore them, or start a new run (another run directory)")
    return None


def prune(run_dir: Path, keep: int) -> None:
    for path in list_checkpoints(run_dir)[keep:]:
        try:
            path.unlink()
        except OSError as exc:
            log.warning("could not delete old checkpoint %s: %s", path, exc)


# --------------------------------------------------------------------------------------------------
# RNG states as tensors
# --------------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors (weights_only-loadable)."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
        "numpy_pos": int(np_state[2]), "numpy_has_gauss": int(np_state[3]), "numpy_gauss": float(np_state[4]),
        "python": torch.tensor(py_internal, dtype=torch.int64), "python_version": int(py_version),
        "python_gauss": py_gauss,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def gather_rng(group: Any, world_size: int) -> list[dict[str, Any]]:
    """Every rank's RNG states (each rank gets the list; rank 0 saves it), gathered over ``group`` — the CPU
    group, so the GPU's queue is not drained; ``group=None``: this process alone."""
    mine = rng_state()
    if group is None:
        return [mine]
    import torch.distributed as dist

    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, mine, group=group)
    return every


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"],
                         state["numpy_has_gauss"], state["numpy_gauss"]))
    random.setstate((state["python_version"], tuple(int(v) for v in state["python"].tolist()),
                     state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())
