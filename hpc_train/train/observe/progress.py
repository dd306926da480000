"""What a training run reports of itself: progress lines read without waiting for the GPU, the time it took, the
summary (the table of many runs is :mod:`hpc_train.runs.report`'s).

* :class:`Progress`: every ``log_every_steps`` the step's loss and the non-finite marker are copied to
  (pinned) host memory without blocking, behind the step that produced them; the line is printed as
  soon as the copy has landed — at a later step, or at an epoch's end, which waits only for what the
  epochs before it recorded (one epoch behind: the GPU is long past them). A non-finite loss seen there
  is raised as :class:`NonFiniteLoss` by the epoch boundary, on every rank at once.
* :class:`RunClock`: time spent training and evaluating, from CUDA events on the GPU (read once at the
  end, no synchronisation on the way) or the host clock on the CPU.
* :func:`finish`: the end-of-run line of rank 0 — ``200 epochs in S s (train I img/s, eval E img/s,
  set-up U s)`` — the table, ``summary.json`` (with the same figures under ``timing``) and the plot, drawn in
  the background after all that (matplotlib imported while training ran: :func:`prepare_pictures`), waited
  for before the rank leaves (:func:`wait_for_pictures`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import HpcTrainError
from ...runs import rundir
from .metrics import format_table, group_sizes, plot_per_class

log = logging.getLogger("hpc_train.train")


class NonFiniteLoss(HpcTrainError):
    """The training loss became nan or inf: the run stops (exit 1) with the step it was seen at."""

    exit_code = 1


def process_age_s() -> float:
    """Seconds since this process started (Linux ``/proc``); 0 where unknown."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


# --------------------------------------------------------------------------------------------------
# Progress lines
# --------------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    values: torch.Tensor
    event: torch.cuda.Event | None
    text: str | None
    """The line with ``{loss}`` still to fill in (None: a check of the flag only)."""
    where: str
    epoch: int
    """The epoch it was recorded in (:meth:`Progress.begin_epoch` counts them)."""


class Progress:
    """Deferred reads of the loss and the non-finite flag (module docstring); ``printing``: rank 0."""

    def __init__(self, device: torch.device, *, printing: bool) -> None:
        self.device, self.printing = device, printing
        self._pending: list[_Pending] = []
        self.nonfinite_at: str | None = None
        """Where a non-finite loss was first seen (epoch and step), once a read has shown it."""
        self._epoch = 0
        self.start(0)

    def start(self, global_step: int) -> None:
        """Training (re)starts at ``global_step``: the rate and ETA count from here."""
        self._started = time.monotonic()
        self._first, self._last = global_step, (self._started, global_step)

    def step_line(self, state: Any, *, epoch: int, total_epochs: int, step: int, steps: int, global_step: int,
                  total_steps: int, batch: int, lr: float) -> None:
        """Record the progress line of this step (``state``: the :class:`~.step.StepState`); printed when
        its loss has reached the host. ``epoch`` counts from 0, ``step`` is steps done in the epoch."""
        now = time.monotonic()
        last_time, last_step = self._last
        images_per_s = (global_step - last_step) * batch / max(now - last_time, 1e-9)
        self._last = (now, global_step)
        eta_s = int((now - self._started) / max(global_step - self._first, 1) * (total_steps - global_step))
        text = (f"epoch {epoch + 1}/{total_epochs} step {step}/{steps} loss {{loss:.4f}} lr {lr:.5f} "
                f"img/s {images_per_s:.0f} eta {eta_s // 3600}:{eta_s // 60 % 60:02d}:{eta_s % 60:02d}")
        self.record(state.loss, state.nonfinite, text, f"epoch {epoch + 1} step {step} (global step {global_step})")

    def begin_epoch(self) -> None:
        """An epoch starts: what is recorded from now on is this epoch's (:meth:`flush` ``behind``)."""
        self._epoch += 1

    def record(self, loss: torch.Tensor, nonfinite: torch.Tensor, text: str | None, where: str) -> None:
        """``nonfinite``: the step state's marker (0, or NaN since a non-finite loss; a bool works too)."""
        values = torch.stack([loss.detach().float(), nonfinite.float()])
        event = None
        if self.device.type == "cuda":
            host = torch.empty(2, dtype=torch.float32, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            values = host
        self._pending.append(_Pending(values, event, text, where, self._epoch))
        self.flush(wait=False)

    def flush(self, *, wait: bool, behind: bool = False) -> None:
        """Print the lines whose values have arrived (all of them, waiting, when ``wait``; with ``behind``, waiting
        only for those of the epochs before this one)."""
        while self._pending:
            first = self._pending[0]
            if first.event is not None and not first.event.query():
                if not wait or (behind and first.epoch >= self._epoch):
                    return
                first.event.synchronize()
            self._pending.pop(0)
            loss, bad = first.values.tolist()
            if bad != 0 and self.nonfinite_at is None:  # NaN (or True): a non-finite loss
                self.nonfinite_at = first.where
            if self.printing and first.text is not None:
                log.info(first.text.format(loss=loss))


# --------------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------------


class RunClock:
    """Seconds spent in ``train`` and ``eval`` spans and the images they handled (module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list[tuple[Any, Any]]] = {"train": [], "eval": []}
        self.images = {"train": 0, "eval": 0}
        self.begin()

    def begin(self) -> None:
        """Training starts now: what the process did before is its set-up."""
        self.started = time.monotonic()
        self.setup_s = process_age_s()

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self, what: str) -> None:
        self.spans[what].append((self._mark(), None))

    def stop(self, what: str, images: int) -> None:
        begin, _ = self.spans[what][-1]
        self.spans[what][-1] = (begin, self._mark())
        self.images[what] += images

    def seconds(self, what: str) -> float:
        done = [(a, b) for a, b in self.spans[what] if b is not None]
        if not self.cuda:
            return sum(b - a for a, b in done)
        if done:
            done[-1][1].synchronize()
        return sum(a.elapsed_time(b) for a, b in done) / 1000.0

    def timing(self, epochs: int) -> dict[str, Any]:
        wall_s = time.monotonic() - self.started
        train_s, eval_s = self.seconds("train"), self.seconds("eval")
        return {"epochs": epochs, "wall_s": round(wall_s, 3), "setup_s": round(self.setup_s, 3),
                "train_s": round(train_s, 3), "eval_s": round(eval_s, 3),
                "train_images": self.images["train"], "eval_images": self.images["eval"],
                "train_images_per_s": round(self.images["train"] / train_s, 1) if train_s > 0 else None,
                "eval_images_per_s": round(self.images["eval"] / eval_s, 1) if eval_s > 0 else None}


def end_line(timing: dict[str, Any]) -> str:
    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    return (f"{timing['epochs']} epochs in {timing['wall_s']:.1f} s (train {rate(timing['train_images_per_s'])} "
            f"img/s, eval {rate(timing['eval_images_per_s'])} img/s, set-up {timing['setup_s']:.1f} s)")


# --------------------------------------------------------------------------------------------------
# The end
# --------------------------------------------------------------------------------------------------


def _brief(r: dict[str, Any] | None) -> dict[str, Any] | None:
    if r is None:
        return None
    keys = ("epoch", "phase", "tau", "top1", "balanced", "many", "medium", "few", "ece", "per_class", "val")
    return {k: r[k] for k in keys if k in r}


def finish(*, run_dir: Path, data_name: str, num_classes: int, total_epochs: int, global_step: int,
           world_size: int, counts: list[int], best: dict[str, Any] | None, last: dict[str, Any] | None,
           tau_record: dict[str, Any] | None, timing: dict[str, Any], is_main: bool,
           best_on_test: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's summary; rank 0 also prints the table and the end line, and writes summary.json and
    the per-class plot. The last evaluation is the headline; ``best`` is chosen on the held-out split (None
    without one); the best test top-1 appears only as ``best_on_test``."""
    summary = {
        "run_dir": str(run_dir), "dataset": data_name, "num_classes": num_classes, "epochs": total_epochs,
        "global_step": global_step, "world_size": world_size, "train_counts": counts,
        "group_sizes": group_sizes(counts), "last": _brief(last), "best": _brief(best),
        "best_on_test": _brief(best_on_test), "tau_norm": _brief(tau_record),
        "posthoc": (last or {}).get("posthoc"), "table": None, "timing": timing, "end_line": end_line(timing),
    }
    if not is_main:
        return summary
    rows = {f"last (ep {last['epoch']})": last} if last else {}
    if best:
        rows[f"best on val (ep {best['epoch']})"] = best
    if best_on_test:
        rows[f"best_on_test (ep {best_on_test['epoch']})"] = best_on_test
    if summary["posthoc"]:
        rows[f"post-hoc tau={summary['posthoc']['tau']:g}"] = summary["posthoc"]
    if tau_record:
        rows[f"tau-norm {tau_record['tau']:.1f}"] = tau_record
    summary["table"] = (f"{data_name}: accuracy (%) on the test split; many >100 / medium / few <20 training "
                        "images\n" + format_table(rows, counts))
    print("\n" + summary["table"], flush=True)
    print(summary["end_line"], flush=True)
    (run_dir / rundir.SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    final = tau_record or last
    if final is not None:
        which = f"tau-normalised (tau {final['tau']:.1f})" if tau_record else f"last epoch ({final['epoch']})"
        _in_background(lambda: plot_per_class(run_dir / "per_class_accuracy.png", final["per_class"], counts,
                                              f"{data_name}: per-class test accuracy, {which}, {final['phase']} phase"))
    return summary


# --------------------------------------------------------------------------------------------------
# The picture, off the critical path
# --------------------------------------------------------------------------------------------------

_pictures: list[threading.Thread] = []


def _in_background(draw: Any) -> None:
    if not _pictures:
        atexit.register(wait_for_pictures)  # never cut short by the interpreter's exit (a test's process)
    thread = threading.Thread(target=draw, name="hpc-train-picture", daemon=True)
    thread.start()
    _pictures.append(thread)


def prepare_pictures() -> None:
    """Import matplotlib in the background while training runs (about a second of the end of a run otherwise;
    the Agg backend, as :mod:`hpc_train.runs.plots` uses it)."""
    def load() -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except ImportError:  # no picture then (plot_per_class says so)
            pass

    _in_background(load)


def wait_for_pictures(timeout_s: float = 120.0) -> None:
    """Until the per-class picture is written (the rank's last act before it leaves: after the end line and
    ``summary.json``)."""
    while _pictures:
        _pictures.pop(0).join(timeout_s)
