"""Measure the memory of a real training step: its peak, and what was live at the peak.

    opt = torch.optim.Adam(model.parameters())
    m = measure_step(model, (x, y), opt, amp=gpulab.runner.autocast)
    m.peak_bytes                   # the most bytes the step had live at once
    print(m.table()); m.plot()     # by category, at the peak
    m.error_of(estimate_memory(model, batch_size=len(x), precision=gpulab.runner.autocast))

The step is the one gpulab.train runs: zero_grad(set_to_none=True), forward and loss under
autocast, (scaled) backward, optimizer step; warmup_steps run first, untracked, so that the
optimizer state exists as it does in every step but the first.

Where the numbers come from:
  cpu   a MemoryTracker (gpulab.memory.tracker) around the step: every storage, by category.
  cuda  the caching allocator, as you would on any GPU job: reset_peak_memory_stats(), the step,
        max_memory_allocated(). Minus the bytes that were allocated before the step and do not
        belong to it (cuBLAS workspaces from the warm-up, other models), so the figure is the
        step's own. The tracker runs too, for the breakdown; what the allocator saw beyond it
        (kernel workspaces, rounding) is reported as untracked_bytes. snapshot_path= also
        records the allocator's history and saves a snapshot to open at
        https://pytorch.org/memory_viz (torch.cuda.memory._record_memory_history / _dump_snapshot).
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab.memory.breakdown import MemoryBreakdown, format_bytes, plot_breakdowns
from gpulab.memory.tracker import MemoryTracker, plot_timeline


@dataclass(frozen=True)
class Measurement:
    """What one real training step held."""

    peak_bytes: int  # the step's peak (cpu: tracked tensors; cuda: the allocator's figure)
    breakdown: MemoryBreakdown  # live tensors at the tracker's peak, by category
    peak_phase: str  # "forward", "backward" or "optimizer"
    peak_op: str  # the aten op that allocated last before the peak
    device: str
    untracked_bytes: int = 0  # cuda: allocator peak beyond the tracked tensors (workspaces)
    timeline: tuple = ()  # (phase, live bytes) after each allocation and free, if recorded

    def table(self) -> str:
        lines = [self.breakdown.table(f"measured on {self.device}: peak "
                                      f"{format_bytes(self.peak_bytes)} during "
                                      f"{self.peak_phase} ({self.peak_op})")]
        if self.untracked_bytes:
            lines.append(f"untracked by tensors (workspaces, allocator rounding): "
                         f"{format_bytes(self.untracked_bytes)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, ax=None, estimate=None):
        """The breakdown at the peak as a stacked bar; with an estimate, both, one above the
        other (matplotlib). Returns the Axes."""
        bars = {"measured": self.breakdown}
        if estimate is not None:
            bars = {"estimate": estimate.peak, **bars}
        return plot_breakdowns(bars, ax=ax)

    def plot_timeline(self, ax=None, label: str | None = "measured"):
        """Live MiB through the step, coloured by phase (needs record_timeline=True)."""
        if not self.timeline:
            raise ValueError("no timeline: call measure_step(..., record_timeline=True)")
        return plot_timeline(list(self.timeline), ax=ax, label=label)

    def error_of(self, estimate) -> float:
        """Relative error of an estimate's peak against this measurement (+0.03: 3% high)."""
        return estimate.peak_bytes / self.peak_bytes - 1


def training_step(model, optimizer, batch, amp=None, loss_fn=None, scaler=None):
    """One optimizer step as gpulab.train runs it; returns the (detached) loss. amp as in
    gpulab.train.train; fp16 needs a GradScaler that lives across steps (scaler=)."""
    from gpulab.train import autocast, cross_entropy, resolve_amp

    x, y = batch
    recipe = resolve_amp(amp, next(model.parameters()).device)
    if recipe is not None and recipe.use_grad_scaler and scaler is None:
        raise ValueError("fp16 autocast needs loss scaling: pass scaler=torch.amp.GradScaler("
                         "device_type), created once and reused, since it learns the scale")
    loss_fn = loss_fn or cross_entropy
    optimizer.zero_grad(set_to_none=True)
    with autocast(recipe):  # forward and loss only, never backward
        loss = loss_fn(model(x), y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss.detach()


def measure_step(model, batch, optimizer, amp=None, loss_fn=None, warmup_steps: int = 1,
                 record_timeline: bool = False, snapshot_path=None) -> Measurement:
    """Run warmup_steps, then one tracked step of `model` on `batch` (x, y), and report its
    peak. amp: None/False for fp32, True for the runner's recipe, or an AutocastRecipe.
    The batch is moved to the model's device first."""
    from gpulab.train import resolve_amp

    device = next(model.parameters()).device
    recipe = resolve_amp(amp, device)
    batch = tuple(t.to(device) for t in batch)
    scaler = (torch.amp.GradScaler(device.type) if recipe is not None and recipe.use_grad_scaler
              else None)
    model.train()
    for _ in range(warmup_steps):
        training_step(model, optimizer, batch, recipe, loss_fn, scaler)
    optimizer.zero_grad(set_to_none=True)  # the step starts without last step's gradients
    tracker = MemoryTracker(model=model, optimizer=optimizer, tensors=batch, device=device,
                            record_timeline=record_timeline)
    if device.type != "cuda":
        with tracker:
            training_step(model, optimizer, batch, recipe, loss_fn, scaler)
        return Measurement(tracker.peak_bytes, tracker.peak_breakdown, tracker.peak_phase,
                           tracker.peak_op, str(device), 0, tuple(tracker.timeline))
    return _measure_cuda(model, optimizer, batch, recipe, loss_fn, scaler, tracker, device,
                         snapshot_path)


def _measure_cuda(model, optimizer, batch, recipe, loss_fn, scaler, tracker, device,
                  snapshot_path) -> Measurement:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    allocated_before = torch.cuda.memory_allocated(device)
    if snapshot_path is not None:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        with tracker:
            tracked_before = tracker.live_bytes
            training_step(model, optimizer, batch, recipe, loss_fn, scaler)
        torch.cuda.synchronize(device)
        if snapshot_path is not None:
            torch.cuda.memory._dump_snapshot(str(snapshot_path))
    finally:
        if snapshot_path is not None:
            torch.cuda.memory._record_memory_history(enabled=None)
    # Bytes allocated before the step that are not its tensors stay allocated through it.
    foreign = max(allocated_before - tracked_before, 0)
    peak = torch.cuda.max_memory_allocated(device) - foreign
    return Measurement(peak, tracker.peak_breakdown, tracker.peak_phase, tracker.peak_op,
                       str(device), max(peak - tracker.peak_bytes, 0), tuple(tracker.timeline))
