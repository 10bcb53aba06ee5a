"""Out of memory: what was live when it happened, and the largest batch that fits.

    try:
        with memory_budget(budget, model=model, optimizer=opt):
            training_step(model, opt, batch)
    except torch.OutOfMemoryError as error:
        print(explain_oom(error))        # live bytes by category, the biggest one, what to try

    step = make_training_step(model, opt, make_batch)   # make_batch(n) -> (x, y)
    search = find_max_batch(step, budget, model=model, optimizer=opt)
    search.max_batch_size                # fits; max_batch_size + 1 does not

find_max_batch doubles the batch until a step fails, then bisects between the last size that
fit and the first that did not. After a failed try it frees what the failure left behind
(gc.collect() for tensors held by reference cycles through the traceback, and on CUDA
torch.cuda.empty_cache(), so the failed try's cached blocks do not crowd the next one). A size
fits when `repeats` steps in a row run: the first step of a fresh optimizer allocates its
state, and on a GPU a second step shows fragmentation.
Taught in: lessons/07_gpu_memory.ipynb; practised in Lab 4 ("Fix the OOM")
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from gpulab.memory.breakdown import MemoryBreakdown, format_bytes
from gpulab.memory.budget import memory_budget

ADVICE = {
    "activations": (
        "halve the batch and accumulate gradients over 2 micro-batches (same effective batch)",
        "activation checkpointing: gpulab.memory.checkpoint_blocks(model) keeps one input per "
        "Block and recomputes the rest in backward (~1/3 more compute)",
        "mixed precision: autocast keeps most activations in 2 bytes instead of 4",
        "shorter sequences (activations grow with B x T, attention scores with T^2 unless "
        "flash attention)"),
    "optimizer": (
        "shard the optimizer state over data-parallel ranks: ZeRO-1 "
        "(gpulab.distributed.zero.ZeroOneOptimizer) or FSDP2",
        "an optimizer with less state: SGD with momentum keeps 1 buffer, Adam 2",
        "an 8-bit optimizer (bitsandbytes): about 2 bytes of state per parameter instead of 8"),
    "parameters": (
        "shard the parameters too: ZeRO-3 / FSDP2 (fully_shard)",
        "keep weights in 16 bits (bf16) and the fp32 copy only in the optimizer",
        "split the model: pipeline or tensor parallelism"),
    "gradients": (
        "zero_grad(set_to_none=True) before the forward pass, so last step's gradients are "
        "freed rather than kept through it",
        "shard the gradients: ZeRO-2 / FSDP2"),
    "temporary": (
        "large gradients of activations: the loss over a big vocabulary makes B x T x V "
        "tensors; compute it in chunks",
        "the optimizer's scratch: foreach=False updates one parameter at a time",
        "on a GPU, fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "other": (
        "tensors kept from earlier steps (a list of losses that still hold the graph: store "
        "loss.item() or loss.detach())",),
}


@dataclass(frozen=True)
class OOMReport:
    """Why an allocation did not fit."""

    tried_bytes: int  # the allocation that failed
    live: MemoryBreakdown  # what was live just before it, by category
    budget_bytes: int  # the limit (0 when unknown)
    op: str  # the op that allocated
    phase: str  # "forward", "backward" or "optimizer"
    dominant: str  # the category holding the most bytes
    advice: tuple[str, ...]  # what to try, for the dominant category

    def __str__(self) -> str:
        lines = [f"out of memory during {self.phase} in {self.op}: tried to allocate "
                 f"{format_bytes(self.tried_bytes)} with {format_bytes(self.live.total)} live"
                 + (f" of a {format_bytes(self.budget_bytes)} budget" if self.budget_bytes
                    else ""),
                 self.live.table(),
                 f"largest: {self.dominant} ({self.live.as_dict()[self.dominant] / 2**20:.2f} "
                 "MiB). Try:"]
        lines += [f"  - {tip}" for tip in self.advice]
        return "\n".join(lines)


def explain_oom(error) -> OOMReport:
    """Read an OutOfMemoryError raised under memory_budget or a MemoryTracker (or its
    .oom_record) and say what was live, which category dominated, and what to try."""
    record = getattr(error, "oom_record", error)
    if not hasattr(record, "live"):
        raise ValueError(
            "this error carries no record of what was live: it was raised outside "
            "gpulab.memory.memory_budget / MemoryTracker. Run the failing step inside one (on a "
            "GPU, torch.cuda.memory_summary() and a memory snapshot tell the allocator's side)")
    dominant = record.live.dominant()
    return OOMReport(record.tried_bytes, record.live, record.budget_bytes, record.op,
                     record.phase, dominant, ADVICE[dominant])


def free_memory(device=None) -> None:
    """Let go of what a failed step left: reference cycles (a traceback and its frames hold the
    step's tensors), and on CUDA the allocator's cached blocks."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.empty_cache()


def make_training_step(model, optimizer, make_batch, amp=None, loss_fn=None):
    """A function of the batch size that runs one training step on make_batch(batch_size)."""
    from gpulab.memory.measure import training_step
    from gpulab.train import resolve_amp

    device = next(model.parameters()).device
    recipe = resolve_amp(amp, device)
    scaler = (torch.amp.GradScaler(device.type) if recipe is not None and recipe.use_grad_scaler
              else None)

    def step(batch_size: int):
        batch = tuple(t.to(device) for t in make_batch(batch_size))
        training_step(model, optimizer, batch, recipe, loss_fn, scaler)

    return step


@dataclass(frozen=True)
class BatchSearch:
    """What find_max_batch tried and found."""

    max_batch_size: int  # the largest size that fit (0: not even the smallest one)
    tries: tuple[tuple[int, bool], ...]  # (batch size, fitted) in the order tried
    budget_bytes: int

    def __str__(self) -> str:
        tried = ", ".join(f"{n}{'' if ok else ' (OOM)'}" for n, ok in self.tries)
        return (f"largest batch under {format_bytes(self.budget_bytes)}: {self.max_batch_size}"
                f" (tried {tried})")


def find_max_batch(step_fn, budget_bytes: int, *, model=None, optimizer=None, device=None,
                   start: int = 1, limit: int = 65536, repeats: int = 2,
                   progress: bool = True) -> BatchSearch:
    """The largest batch size n in [start, limit] for which step_fn(n) runs `repeats` times
    under memory_budget(budget_bytes) (model and optimizer: what already lives on the device,
    for the CPU's tracked budget). Assumes memory grows with the batch size. A tqdm bar counts
    the tries (a dozen or so, each a few training steps); progress=False hides it."""
    from tqdm.auto import tqdm

    tries: list[tuple[int, bool]] = []
    bar = tqdm(desc="find_max_batch", unit="try", disable=not progress)

    def fits(n: int) -> bool:
        bar.set_postfix_str(f"trying batch {n}")
        try:
            with memory_budget(budget_bytes, model=model, optimizer=optimizer, device=device):
                for _ in range(repeats):
                    step_fn(n)
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        if not ok:  # a successful step frees its tensors itself
            free_memory(device)
        tries.append((n, ok))
        bar.update()
        return ok

    try:
        good = _search(fits, start, limit)
        bar.set_postfix_str(f"largest batch that fits: {good}")
    finally:
        bar.close()
    return BatchSearch(good, tuple(tries), int(budget_bytes))


def _search(fits, start: int, limit: int) -> int:
    """The largest n in [start, limit] with fits(n), 0 when none: double, then bisect."""
    good, bad = 0, None
    n = start
    while n <= limit:  # double until a size fails
        if not fits(n):
            bad = n
            break
        good, n = n, n * 2
    if bad is None:  # even `limit` may not have been tried: try it last
        if good < limit and fits(limit):
            good = limit
        bad = limit + 1 if good == limit else min(n, limit)
    while bad - good > 1:  # bisect between the last fit and the first failure
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
