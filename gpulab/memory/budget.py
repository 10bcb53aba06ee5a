"""Run code under a device-memory budget, and get the error a full GPU gives.

    with memory_budget(8 * 2**20, model=model, optimizer=opt, tensors=(x, y)) as budget:
        training_step(model, opt, (x, y))    # torch.OutOfMemoryError once 8 MiB would be passed
    budget.peak_bytes                        # how close it came, when it fit

The same code, the same exception type, on both runners:

  cuda  torch.cuda.set_per_process_memory_fraction(budget / total memory): the caching allocator
        will not reserve more, and when an allocation does not fit (even after it has freed its
        cached blocks and retried) it raises the real torch.OutOfMemoryError, "CUDA out of
        memory. Tried to allocate ...". The budget covers everything this process holds on the
        GPU, the model included. The previous fraction is restored on exit.
  cpu   a MemoryTracker with budget_bytes: the error is raised at the op whose outputs take the
        live tensors past the budget, with a message of the same shape ("... out of memory.
        Tried to allocate X MiB ... of which Y MiB is free ..."), saying it is simulated. It
        counts what it is told about (model, optimizer, tensors) and every tensor made inside.

Either way the error carries .oom_record (what was live, by category) for explain_oom, and
everything is undone on exit: the tracker's hooks, the allocator's limit.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import torch

from gpulab.memory.tracker import MemoryTracker


def _device(model, device):
    if device is not None:
        return torch.device(device)
    first = next(model.parameters(), None) if model is not None else None
    if first is not None:
        return first.device
    import gpulab

    return gpulab.runner.device


class memory_budget:  # lower case: it reads as a function, `with memory_budget(...)`
    """Limit device memory to budget_bytes inside the `with` block; see the module docstring."""

    def __init__(self, budget_bytes: int, model=None, optimizer=None, tensors=(), device=None):
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.device = _device(model, device)
        on_cuda = self.device.type == "cuda"
        # On CUDA the allocator enforces the budget; the tracker only says what was live.
        self.tracker = MemoryTracker(model=model, optimizer=optimizer, tensors=tensors,
                                     budget_bytes=self.budget_bytes, device=self.device,
                                     enforce_budget=not on_cuda)
        self._previous_fraction = None

    @property
    def peak_bytes(self) -> int:
        """The most bytes the tracked tensors held at once inside the block."""
        return self.tracker.peak_bytes

    def __enter__(self):
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else \
                torch.cuda.current_device()
            self.device = torch.device("cuda", index)
            get = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.7
            self._previous_fraction = get(index) if get is not None else 1.0
            total = torch.cuda.get_device_properties(index).total_memory
            torch.cuda.empty_cache()  # cached blocks from earlier work would count as reserved
            torch.cuda.set_per_process_memory_fraction(min(self.budget_bytes / total, 1.0), index)
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.tracker.__exit__(*exc)
        finally:
            if self._previous_fraction is not None:
                torch.cuda.set_per_process_memory_fraction(self._previous_fraction,
                                                           self.device.index)
                self._previous_fraction = None
        return False
