"""Activation checkpointing: keep only each block's input, recompute the rest in backward.

    checkpoint_blocks(model)                 # every GPT Block now runs under checkpoint
    tradeoff = checkpointing_tradeoff(GPT(config), batch)
    tradeoff.memory_saved, tradeoff.extra_compute    # e.g. 0.45 of the peak, +28% FLOPs

A Block normally keeps a dozen tensors for backward (LayerNorm inputs, q, k, v, the attention
output, the 4C-wide feed-forward activations...). Under torch.utils.checkpoint it keeps only
its input; when backward reaches it, it runs its forward again to recreate them, then runs its
backward. Activation memory drops from (all Blocks' saved tensors) to (one input per Block +
one Block's saved tensors), for one more forward pass through the Blocks: about a third more
compute (forward ~ 1/3 of a step's FLOPs).

The non-reentrant version (use_reentrant=False) is the one to use: it works with
torch.autograd.grad, with inputs that do not require grad, and stops recomputing as soon as it
has what backward needs. checkpoint_blocks swaps the forward of each block instance, so the
model's parameters, state_dict keys and optimizer are untouched; uncheckpoint_blocks undoes it.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


def _checkpointed_forward(self, *args, **kwargs):
    # type(self).forward: the class's own forward, not this instance attribute (no recursion)
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)


def _blocks_of(model, blocks):
    if blocks is not None:
        return list(blocks)
    if hasattr(model, "blocks"):
        return list(model.blocks)
    raise ValueError(f"{type(model).__name__} has no .blocks: pass the modules to checkpoint, "
                     "e.g. checkpoint_blocks(model, blocks=[model.net])")


def checkpoint_blocks(model, blocks=None):
    """Run each module in `blocks` (default: model.blocks, the GPT's Blocks) under
    torch.utils.checkpoint; returns the model (changed in place)."""
    for block in _blocks_of(model, blocks):
        block.forward = types.MethodType(_checkpointed_forward, block)
    return model


def uncheckpoint_blocks(model, blocks=None):
    """Undo checkpoint_blocks."""
    for block in _blocks_of(model, blocks):
        if "forward" in vars(block):
            del block.forward
    return model


def is_checkpointed(module) -> bool:
    return getattr(vars(module).get("forward"), "__func__", None) is _checkpointed_forward


@dataclass(frozen=True)
class CheckpointTradeoff:
    """What checkpointing every block bought and cost on one training step."""

    peak_bytes: int  # the step's peak without checkpointing
    peak_bytes_checkpointed: int
    saved_activation_bytes: int  # activations live at the end of forward, without
    saved_activation_bytes_checkpointed: int
    flops: int  # FLOPs of one training step (matmuls, convolutions, attention), without
    flops_checkpointed: int

    @property
    def memory_saved(self) -> float:
        """Fraction of the peak that checkpointing removed."""
        return 1 - self.peak_bytes_checkpointed / self.peak_bytes

    @property
    def extra_compute(self) -> float:
        """Extra FLOPs per step, as a fraction (the recomputed forward of the blocks)."""
        return self.flops_checkpointed / self.flops - 1

    def __str__(self) -> str:
        return (f"checkpointing: peak {self.peak_bytes / 2**20:.2f} -> "
                f"{self.peak_bytes_checkpointed / 2**20:.2f} MiB (-{self.memory_saved:.0%}), "
                f"activations at the end of forward {self.saved_activation_bytes / 2**20:.2f} -> "
                f"{self.saved_activation_bytes_checkpointed / 2**20:.2f} MiB, "
                f"FLOPs +{self.extra_compute:.0%}")


def checkpointing_tradeoff(model, batch, optimizer_class=torch.optim.Adam, amp=None,
                           blocks=None, progress: bool = True) -> CheckpointTradeoff:
    """Measure one training step of (copies of) `model` on `batch` without and with
    checkpoint_blocks: peak memory (gpulab.memory.measure_step), the activations still held
    when backward starts, and FLOPs (torch.utils.flop_counter). A tqdm bar over the two
    (several seconds each on a CPU); progress=False hides it."""
    from torch.utils.flop_counter import FlopCounterMode
    from tqdm.auto import tqdm

    from gpulab.memory.measure import measure_step, training_step
    from gpulab.memory.tracker import MemoryTracker

    ids = {id(b) for b in _blocks_of(model, blocks)}
    device = next(model.parameters()).device
    batch = tuple(t.to(device) for t in batch)
    results = []
    bar = tqdm((False, True), desc="checkpointing_tradeoff", unit="step", disable=not progress)
    for checkpointed in bar:
        bar.set_postfix_str("checkpointed" if checkpointed else "plain")
        m = copy.deepcopy(model)
        twins = [c for o, c in zip(model.modules(), m.modules(), strict=True) if id(o) in ids]
        (checkpoint_blocks if checkpointed else uncheckpoint_blocks)(m, twins)
        optimizer = optimizer_class(m.parameters())
        measured = measure_step(m, batch, optimizer, amp=amp)
        held = _activations_at_backward(m, batch, amp, MemoryTracker)
        with FlopCounterMode(display=False) as counter:
            training_step(m, optimizer, batch, _recipe(amp, m))
        results.append((measured.peak_bytes, held, counter.get_total_flops()))
    (p0, a0, f0), (p1, a1, f1) = results
    return CheckpointTradeoff(p0, p1, a0, a1, f0, f1)


def _recipe(amp, model):
    from gpulab.train import resolve_amp

    return resolve_amp(amp, next(model.parameters()).device)


def _activations_at_backward(model, batch, amp, tracker_class) -> int:
    """Bytes of forward-pass tensors still live when the loss is ready (what backward needs)."""
    from gpulab.train import autocast, cross_entropy

    x, y = batch
    with tracker_class(model=model, tensors=batch) as tracker:
        with autocast(_recipe(amp, model)):
            loss = cross_entropy(model(x), y)
        held = tracker.live_breakdown().activations
    loss.backward()  # frees the graph; gradients are dropped below
    model.zero_grad(set_to_none=True)
    return held
