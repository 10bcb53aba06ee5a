"""Counting what crosses between host and device in a step: syncs and host-to-device copies.

    from gpulab.profiling.transfers import count_transfers
    counts = count_transfers(one_step, model, steps=5)
    print(counts)                     # per step: syncs, copies to the device and their bytes
    counts.syncs, counts.h2d_copies, counts.h2d_bytes, counts.pageable_copies

A sync is a read of a device tensor by the host: .item(), .tolist(), .numpy(), .cpu(),
float() / int() / bool() of a tensor, .to("cpu"). Each one makes the host wait until the device
has finished all the work queued before it. A host-to-device copy is .to(device) / .cuda() of a
host tensor, or torch.tensor(..., device=device); a copy from pageable (not pinned) memory, or
without non_blocking=True, also makes the host wait.

The counts do not depend on timing, so they are the same on either runner. On the cpu runner the
"device" is the CPU itself and nothing waits, so the device's tensors are told from the host's by
where they came from: the model's parameters, what was copied "to the device", and everything
computed from those. A read of such a tensor is counted as the sync it would be on a GPU, and
returns a copy, as it would on a GPU (on a CPU, .cpu() would return the tensor itself). On the
cpu runner a copy back written as .to(device) with a CPU device cannot be told from a no-op and
is not counted; write .cpu() or .item().
Taught in: Lab 4 (solutions/lab4_memory_and_profiling), lessons/08_profiling_and_optimization
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")
FROM_PYTHON = ("tensor", "as_tensor")  # with device=...: a copy from host memory


@dataclass(frozen=True)
class Transfers:
    """Host-device traffic per step, the mean over the steps counted."""

    syncs: float  # reads of device tensors by the host (.item(), .cpu(), ...): each one waits
    h2d_copies: float  # copies from host memory to the device
    h2d_bytes: float  # bytes those copies moved
    pageable_copies: float  # of the copies, those from pageable (not pinned) memory
    blocking_copies: float  # of the copies, those without non_blocking=True
    steps: int  # steps counted
    device: str  # "cuda" or "cpu"

    def __str__(self) -> str:
        return (f"host <-> {self.device}, per step (mean of {self.steps}):\n"
                f"  syncs (host waits for the device) {self.syncs:10.2f}\n"
                f"  copies host -> device             {self.h2d_copies:10.2f}\n"
                f"    bytes copied                    {self.h2d_bytes:10.0f}\n"
                f"    from pageable memory            {self.pageable_copies:10.2f}\n"
                f"    blocking                        {self.blocking_copies:10.2f}")


def _target_device(args, kwargs):
    """The device a .to(...) call names, or None for a dtype-only conversion."""
    for value in (kwargs.get("device"), *args[1:]):
        if isinstance(value, str | torch.device):
            return torch.device(value)
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _non_blocking(args, kwargs) -> bool:
    return kwargs.get("non_blocking") is True or any(a is True for a in args[2:])


class TransferWatch(TorchFunctionMode):
    """While active, counts syncs and host-to-device copies to `device` (see the docstring)."""

    def __init__(self, device: torch.device, on_device=()):
        super().__init__()
        self.device = torch.device(device)
        self.on_device = WeakIdKeyDictionary()  # the device's tensors, by identity
        for tensor in on_device:
            self.on_device[tensor] = True
        self.syncs = self.h2d_copies = self.h2d_bytes = 0
        self.pageable = self.blocking = 0

    def _is_device(self, value) -> bool:
        return isinstance(value, torch.Tensor) and value in self.on_device

    def _mark(self, result) -> None:
        for value in result if isinstance(result, list | tuple) else (result,):
            if isinstance(value, torch.Tensor):
                self.on_device[value] = True

    def _copy_in(self, source: torch.Tensor, n_bytes: int, non_blocking: bool) -> None:
        self.h2d_copies += 1
        self.h2d_bytes += n_bytes
        self.pageable += not source.is_pinned()
        self.blocking += not non_blocking

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        result = func(*args, **kwargs)
        source = args[0] if args else None
        if name in READS and self._is_device(source):
            self.syncs += 1
            # on the cpu runner .cpu() returns the tensor itself; a GPU returns a host copy
            return result.clone() if result is source else result
        if name in ("to", "cuda") and isinstance(source, torch.Tensor):
            return self._moved(source, result, name, args, kwargs)
        if name in FROM_PYTHON and self._names_device(kwargs):
            self._copy_in(torch.empty(0), result.nbytes, non_blocking=False)
            self._mark(result)
        elif self._names_device(kwargs) or any(map(self._is_device, _tensors(args, kwargs))):
            self._mark(result)  # made on the device, or computed from its tensors
        return result

    def _names_device(self, kwargs) -> bool:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == self.device.type

    def _moved(self, source, result, name, args, kwargs):
        """A .to(...) or .cuda(): a copy in, a copy back (a sync), or neither."""
        target = torch.device("cuda") if name == "cuda" else _target_device(args, kwargs)
        if self._is_device(source):
            if target is not None and target.type == "cpu" != self.device.type:
                self.syncs += 1  # back to the host: only a GPU runner can tell
                return result
        elif target is not None and target.type == self.device.type:
            self._copy_in(source, source.nbytes, _non_blocking(args, kwargs))
            # on the cpu runner .to(device) returns the tensor itself; a GPU makes a new one
            result = result.clone() if result is source else result
        else:
            return result  # a host tensor stays on the host (a dtype change, say)
        self._mark(result)
        return result


def _tensors(args, kwargs):
    """The tensors among a call's arguments, and inside its lists (torch.stack, _foreach_*)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def count_transfers(step, model, steps: int = 3) -> Transfers:
    """Run `step()` `steps` times and count, per step, the syncs and the copies to the device of
    `model`'s parameters (its gradients and optimizer state count as the device's too)."""
    device = next(model.parameters()).device
    watch = TransferWatch(device, on_device=list(model.parameters()))
    with watch:
        for _ in range(steps):
            step()
    return Transfers(syncs=watch.syncs / steps, h2d_copies=watch.h2d_copies / steps,
                     h2d_bytes=watch.h2d_bytes / steps, pageable_copies=watch.pageable / steps,
                     blocking_copies=watch.blocking / steps, steps=steps, device=device.type)
