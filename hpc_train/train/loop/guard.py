"""A dispatcher-level guard against host synchronisation inside the training step.

A CUDA graph records the kernels a step launches and nothing else: a value the step reads back to the
host (``.item()``, ``if tensor:``, a boolean-mask selection whose size the host must know, a copy to
the CPU) is read once, at capture, and then silently frozen; on the eager path the same read makes the
host wait for the GPU at every step. :class:`NoHostSync` sits in PyTorch's dispatcher (a
``TorchDispatchMode``) and raises :class:`HostSyncError` on the operators that do that, on every device
— so a CPU test proves the step would be capturable, and catches the read before a GPU ever runs it.
On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` is the second line (``tests/unit/train/gpu_check.py``).

Rejected: ``_local_scalar_dense`` (every ``.item()``, ``bool(tensor)``, ``int(tensor)``), ``nonzero``
and indexing with a boolean mask (``x[mask]``, ``torch.where(cond)``), ``equal`` (a host bool),
data-dependent shapes (``masked_select``, ``unique``), and copies from an accelerator (or ``meta``) to
the CPU. (``index_put_`` with a mask — ``x[mask] = v`` — is rejected too: on CUDA it syncs the same way.)
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SYNCING = {"_local_scalar_dense", "nonzero", "equal", "masked_select", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "unique_dim_consecutive"}
"""Operator names (overload packets) whose result the host must wait for."""


class HostSyncError(RuntimeError):
    """The step asked for a value on the host (see :class:`NoHostSync`)."""


def _off_cpu(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


def _mask_index(func, args: tuple) -> bool:
    """Indexing with a boolean mask: its result's size is the mask's count, which the host must read."""
    if func.overloadpacket.__name__ not in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _to_host(func, args: tuple, kwargs: dict) -> bool:
    """A copy whose source is off the CPU and whose destination is the CPU."""
    name = func.overloadpacket.__name__
    if name == "_to_copy":
        device = kwargs.get("device")
        return _off_cpu(args[0]) and device is not None and torch.device(device).type == "cpu"
    if name == "copy_":
        return isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu" and _off_cpu(args[1])
    return False


class NoHostSync(TorchDispatchMode):
    """Raise :class:`HostSyncError` on any operator that makes the host wait for the device (see the
    module docstring). ``where`` names the code under guard in the message. ``record=True`` lets the
    operators run and lists them in :attr:`seen` instead (the capture check of plug-in code: a real step
    must not be cut short half-way)."""

    def __init__(self, where: str = "the training step", *, record: bool = False) -> None:
        super().__init__()
        self.where, self.record = where, record
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _SYNCING or _mask_index(func, args) or _to_host(func, args, kwargs):
            if not self.record:
                raise HostSyncError(f"{func} inside {self.where} makes the host wait for the device (a CUDA graph "
                                    "would freeze its value at capture); keep the value on the device")
            self.seen.append(str(func))
        return func(*args, **kwargs)
