"""A tracker of live tensor memory: every storage, by category, after every op, and the peak.

    with MemoryTracker(model=model, optimizer=opt, tensors=(x, y)) as tracker:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    tracker.peak_bytes          # the most bytes that were live at once
    tracker.peak_breakdown      # a MemoryBreakdown of that moment
    tracker.live_breakdown()    # ...and of now

How it knows: a TorchDispatchMode sees the outputs of every aten op run inside it: forward,
backward and the optimizer's update alike. Each new storage is counted once, however many
tensors view it, and a weakref callback takes it off the books when the storage is freed. So
after every op the tracker knows which storages are live and what they are for:

    parameters    registered on entry (the model's weights and buffers were made before)
    optimizer     registered on entry, and whatever sits in optimizer.state after a step
    gradients     relabelled when autograd stores a parameter's .grad (post-accumulate hook)
    activations   made while no backward and no optimizer step runs: the forward pass
    temporary     made in backward (activation gradients) or in an optimizer step (scratch)
    other         the tensors passed as `tensors` (the batch)

budget_bytes: raise torch.OutOfMemoryError at the op whose outputs take the live total past
the budget: the same error type, at the same op, as a GPU that ran out (memory_budget uses it;
enforce_budget=False only records). Either way, an OutOfMemoryError raised inside the tracker
(simulated, or a real one from the CUDA allocator) carries .oom_record: what was live, by
category, when the allocation failed (gpulab.memory.explain_oom reads it).

On CUDA each storage counts as the caching allocator would place it, rounded up to 512 bytes.
What it cannot see: memory a kernel uses and frees inside one op (library workspaces), tensors
made before entering that were not registered, and storages resized in place outside the
dispatcher (FSDP's untyped_storage().resize_(0)): they keep the size they were first seen with.
torch ships a fuller tracker, torch.distributed._tools.mem_tracker.MemTracker (per module and
phase); the tests check that this one finds the same peak.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from functools import partial

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gpulab.memory.breakdown import CATEGORIES, MemoryBreakdown, format_bytes

CUDA_BLOCK = 512  # the caching allocator rounds every allocation up to a multiple of this


def allocated_bytes(nbytes: int, device_type: str) -> int:
    """Bytes a storage of `nbytes` takes on the device: CUDA rounds up to 512-byte blocks."""
    if device_type == "cuda":
        return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    return nbytes


@dataclass(frozen=True)
class OOMRecord:
    """What was live when an allocation did not fit."""

    tried_bytes: int  # the failing op's new storages
    live: MemoryBreakdown  # live bytes by category just before that op
    budget_bytes: int  # the limit that was crossed
    op: str  # the aten op, e.g. "aten.addmm.default"
    phase: str  # "forward", "backward" or "optimizer"


class _Storage:
    __slots__ = ("nbytes", "category", "ref")

    def __init__(self, nbytes, category, ref):
        self.nbytes, self.category, self.ref = nbytes, category, ref


class MemoryTracker(TorchDispatchMode):
    """Count live tensor storages on one device, by category; keep the peak and its breakdown.

    model, optimizer, tensors: what exists before entering (parameters, optimizer state and
    existing grads, the batch) and must count. device: the device whose memory is counted
    (default: the model's, else the CPU); storages elsewhere are ignored. record_timeline: keep
    (phase, live bytes) after every allocation and free, for plot_timeline.
    """

    def __init__(self, model=None, optimizer=None, tensors=(), budget_bytes: int | None = None,
                 device=None, record_timeline: bool = False, enforce_budget: bool = True):
        super().__init__()
        if device is None:
            first = next(model.parameters(), None) if model is not None else None
            device = first.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.model, self.optimizer, self.tensors = model, optimizer, tuple(tensors)
        self.budget_bytes, self.enforce_budget = budget_bytes, enforce_budget
        self.record_timeline = record_timeline
        self.timeline: list[tuple[str, int]] = []
        self.oom: OOMRecord | None = None
        self._live: dict[int, _Storage] = {}
        self._bytes = dict.fromkeys(CATEGORIES, 0)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_breakdown = MemoryBreakdown()
        self.peak_phase, self.peak_op = "", ""
        self._stepping = None  # the optimizer whose step() is running
        self._handles = []

    # ------------------------------------------------------------ books

    def _count(self, t: torch.Tensor, category: str, relabel: bool = False) -> int:
        """Put t's storage on the books (or relabel it); return the bytes it added."""
        if t.device.type != self.device.type or (self.device.index is not None
                                                 and t.device.index != self.device.index):
            return 0
        try:
            storage = t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse, nested: no plain storage
            return 0
        key = id(storage)
        entry = self._live.get(key)
        if entry is not None:
            if relabel and entry.category != category:
                self._bytes[entry.category] -= entry.nbytes
                self._bytes[category] += entry.nbytes
                entry.category = category
            return 0
        nbytes = allocated_bytes(storage.nbytes(), t.device.type)
        if nbytes == 0:
            return 0
        # The callback runs when the storage itself dies, not when this tensor does: views
        # and autograd's saved tensors keep it alive, exactly as they keep device memory.
        self._live[key] = _Storage(nbytes, category, weakref.ref(storage, partial(self._free,
                                                                                  key)))
        self._bytes[category] += nbytes
        self.live_bytes += nbytes
        return nbytes

    def _free(self, key, _ref):
        entry = self._live.pop(key, None)
        if entry is not None:
            self._bytes[entry.category] -= entry.nbytes
            self.live_bytes -= entry.nbytes
            if self.record_timeline:
                self.timeline.append((self.phase(), self.live_bytes))

    def track(self, *tensors, category: str = "other") -> None:
        """Count tensors made elsewhere (or relabel them): category is one of CATEGORIES."""
        if category not in CATEGORIES:
            raise ValueError(f"category {category!r} is not one of {CATEGORIES}")
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._count(t, category, relabel=True)

    def live_breakdown(self) -> MemoryBreakdown:
        """Bytes live now, by category."""
        return MemoryBreakdown(**self._bytes)

    def phase(self) -> str:
        """"optimizer" inside optimizer.step(), "backward" inside autograd, else "forward"."""
        if self._stepping is not None:
            return "optimizer"
        # -1 outside backward; torch.utils.checkpoint asks autograd the same question.
        return "forward" if torch._C._current_graph_task_id() == -1 else "backward"

    def _track_optimizer_state(self, optimizer) -> None:
        for state in optimizer.state.values():
            self.track(list(state.values()), category="optimizer")

    # ------------------------------------------------------------ the mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            out = func(*args, **(kwargs or {}))
        except torch.OutOfMemoryError as error:  # a real device ran out inside this op
            if not hasattr(error, "oom_record"):
                self.oom = OOMRecord(tried_allocation_bytes(str(error)), self.live_breakdown(),
                                     self.budget_bytes or 0, str(func), self.phase())
                error.oom_record = self.oom
            raise
        phase = self.phase()
        category = "activations" if phase == "forward" else "temporary"
        new = sum(self._count(t, category) for t in _tensors(out))
        if new:
            error = self._after_allocation(new, category, func, phase)
            if error is not None:
                del out  # as on a GPU, the tensor that did not fit is never handed out
                try:
                    raise error
                finally:  # no frame -> error -> traceback -> frame cycle to wait for gc
                    del error
        return out

    def _after_allocation(self, new: int, category: str, func, phase: str):
        """Update the peak, or return the OutOfMemoryError to raise if past the budget."""
        over = (self.enforce_budget and self.budget_bytes is not None
                and self.live_bytes > self.budget_bytes)
        if self._stepping is not None and (over or self.live_bytes > self.peak_bytes):
            # a first step creates the state as it goes: name it before taking a snapshot
            self._track_optimizer_state(self._stepping)
        if over:
            live = dict(self._bytes)
            live[category] -= new
            self.oom = OOMRecord(new, MemoryBreakdown(**live), self.budget_bytes, str(func),
                                 phase)
            error = torch.OutOfMemoryError(out_of_memory_message(self.oom))
            error.oom_record = self.oom  # for explain_oom(error)
            return error
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_breakdown = self.live_breakdown()
            self.peak_phase, self.peak_op = phase, str(func)
        if self.record_timeline:
            self.timeline.append((phase, self.live_bytes))
        return None

    def __enter__(self):
        if self.model is not None:
            self.track(list(self.model.parameters()), list(self.model.buffers()),
                       category="parameters")
            for p in self.model.parameters():
                if p.grad is not None:
                    self.track(p.grad, category="gradients")
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(
                        lambda p: self.track(p.grad, category="gradients")))
        if self.optimizer is not None:
            self._track_optimizer_state(self.optimizer)
        self.track(self.tensors, category="other")

        def before_step(optimizer, args, kwargs):
            self._stepping = optimizer

        def after_step(optimizer, args, kwargs):
            self._track_optimizer_state(optimizer)
            self._stepping = None

        self._handles += [register_optimizer_step_pre_hook(before_step),
                          register_optimizer_step_post_hook(after_step)]
        self.peak_bytes = self.live_bytes  # the step starts with what is already there
        self.peak_breakdown = self.live_breakdown()
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stepping = None
        return super().__exit__(*exc)

    def plot_timeline(self, ax=None, label: str | None = None):
        """Live MiB after each allocation and free, coloured by phase (needs record_timeline)."""
        if not self.timeline:
            raise ValueError("no timeline: create the tracker with record_timeline=True")
        return plot_timeline(self.timeline, ax=ax, label=label)


def plot_timeline(timeline: list[tuple[str, int]], ax=None, label: str | None = None):
    """(phase, live bytes) pairs in order, as live MiB over the step (x: 0 at the first event,
    1 at the last, so an estimate's and a measurement's timelines line up on one `ax`)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 3))[1]
    colors = {"forward": "#4c72b0", "backward": "#c44e52", "optimizer": "#55a868"}
    n = max(len(timeline) - 1, 1)
    x = [i / n for i in range(len(timeline))]
    mib = [b / 2**20 for _, b in timeline]
    ax.plot(x, mib, linewidth=0.9, label=label, color=None if label else "0.6")
    shown = set(ax.get_legend_handles_labels()[1])
    for phase, color in colors.items():
        xs = [i for i, (p, _) in enumerate(timeline) if p == phase]
        ax.scatter([x[i] for i in xs], [mib[i] for i in xs], s=4, color=color,
                   label=None if phase in shown else phase)
    ax.set_xlabel("progress through the step (allocations and frees, in order)")
    ax.set_ylabel("live MiB")
    ax.legend(frameon=False)
    return ax


def _tensors(out):
    """The tensors an op returned: one, a tuple or list of them, or (rarely) a nested mix."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple | list) and all(isinstance(t, torch.Tensor) for t in out):
        return out
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def out_of_memory_message(record: OOMRecord) -> str:
    """A message shaped like CUDA's, for a budget simulated on the CPU."""
    live = record.live
    free = max(record.budget_bytes - live.total, 0)
    parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in live.as_dict().items() if n)
    return (f"Simulated device out of memory (a gpulab memory budget, not a real GPU). "
            f"Tried to allocate {format_bytes(record.tried_bytes)}. The budget has a total "
            f"capacity of {format_bytes(record.budget_bytes)} of which {format_bytes(free)} is "
            f"free. Of the budget, {format_bytes(live.total)} is allocated by live tensors "
            f"({parts or 'none'}). The allocation was in {record.op}, during {record.phase}. "
            "gpulab.memory.explain_oom(error) says what to do about it.")


_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1, "B": 1}


def tried_allocation_bytes(message: str) -> int:
    """The size in "Tried to allocate 20.00 MiB" of an out-of-memory message (0 if absent)."""
    found = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|bytes|B)", message)
    return round(float(found.group(1)) * _UNITS[found.group(2)]) if found else 0
