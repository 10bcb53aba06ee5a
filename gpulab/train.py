"""One training loop for every device (cuda, mps, xpu, cpu), with mixed precision done right.

    history = train(model, loader, optimizer, steps=200, amp=gpulab.runner.autocast)

One optimizer step, as the course teaches it:
    1. for each of grad_accum_steps micro-batches:
           autocast around the forward pass and the loss only (never around backward),
           loss / grad_accum_steps, so the summed gradients are the big batch's mean gradient,
           scaler.scale(loss).backward()          (fp16: gradients of loss*S survive in fp16)
    2. scaler.unscale_(optimizer), then clip    (clip the true gradients, not the scaled ones)
    3. scaler.step(optimizer)                   (fp16: skipped when a gradient is inf/NaN)
    4. scaler.update()                          (fp16: halve S after inf, grow it when stable)
With bf16 or fp32 the scaler is disabled and each of its calls is a plain pass-through.

overfit_one_batch(model, batch) is the first test of any new model: it must memorize one batch.
Checkpoints and bit-identical resume: see gpulab.checkpoint.
Taught in: lessons/03_pytorch_on_the_gpu.ipynb, Lab 2
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from gpulab.checkpoint import (
    TrainState,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from gpulab.data import IGNORE_INDEX
from gpulab.env import AutocastRecipe

SHOW_LOSS_EVERY = 10  # steps between loss readouts: each .item() waits for the device


def cross_entropy(y_hat, y):
    """Mean cross-entropy over every position: logits (..., n_classes), targets (...).

    Works for classifiers, (B, n_classes) and (B,), and for language models, (B, T, vocab) and
    (B, T); targets equal to IGNORE_INDEX do not count.
    """
    return F.cross_entropy(y_hat.flatten(0, -2), y.flatten(), ignore_index=IGNORE_INDEX)


@dataclass
class History:
    """What a call to train() did."""

    losses: list[float]  # one per optimizer step from step 0 (a resumed run includes earlier ones)
    resumed_from: int  # the step this call started at: 0 unless it resumed from a checkpoint
    seconds: float  # wall time of this call

    @property
    def steps(self) -> int:
        return len(self.losses)


def resolve_amp(amp, device: torch.device) -> AutocastRecipe | None:
    """None/False: fp32. True: the runner's recipe. A recipe: checked against the device."""
    if amp is None or amp is False:
        return None
    if amp is True:
        import gpulab

        if device.type == gpulab.runner.device_kind:
            return gpulab.runner.autocast
        if device.type == "cpu":
            return AutocastRecipe("cpu", "bfloat16", False)
        raise ValueError(f"no default mixed-precision recipe for {device}: pass an AutocastRecipe")
    if amp.device_type != device.type:
        raise ValueError(
            f"autocast recipe is for {amp.device_type!r} but the model trains on {device.type!r}: "
            "torch.autocast only affects ops on its own device type, so it would silently do "
            "nothing. Use gpulab.runner.autocast, or a recipe whose device_type matches.")
    if amp.device_type == "cpu" and amp.dtype_name == "float16":
        warnings.warn("fp16 autocast on a CPU runs emulated fp16 matmuls, often 100x slower than "
                      "bf16; the cpu runner's recipe uses bf16.", stacklevel=3)
    return amp


def autocast(recipe: AutocastRecipe | None):
    """torch.autocast for `recipe`, or a context that changes nothing (fp32)."""
    if recipe is None:
        return nullcontext()
    return torch.autocast(recipe.device_type, dtype=recipe.dtype)


class _Batches:
    """Micro-batches from `loader`, pass after pass, keeping state.epoch/batch_in_epoch current."""

    def __init__(self, loader, state: TrainState, device: torch.device):
        self.loader, self.state, self.device = loader, state, device
        self.sampler = getattr(loader, "sampler", None)
        self._it = None

    def _generators(self) -> list[torch.Generator]:
        found = [getattr(self.loader, "generator", None), getattr(self.sampler, "generator", None)]
        unique = []  # a shuffling DataLoader hands its own generator to its RandomSampler
        for g in found:
            if g is not None and all(g is not u for u in unique):
                unique.append(g)
        return unique

    def _start_pass(self, replay: bool) -> None:
        st = self.state
        if replay:  # rewind the generators to the start of the pass being resumed
            torch.set_rng_state(st.epoch_rng["torch"].cpu())
            for g, s in zip(self._generators(), st.epoch_rng["loader"], strict=True):
                g.set_state(s.cpu())
        else:
            st.epoch_rng = {"torch": torch.get_rng_state(),
                            "loader": [g.get_state() for g in self._generators()]}
        if hasattr(self.sampler, "set_epoch"):  # SeededSampler, DistributedSampler
            self.sampler.set_epoch(st.epoch)
        skip = st.batch_in_epoch if replay else 0
        batch_size = getattr(self.loader, "batch_size", None)
        # SeededSampler can jump past the consumed samples without loading them. Not with
        # worker processes: each worker's generators advance with every item it loads, and which
        # worker loads which batch depends on the position in the pass, so both must be replayed.
        fast = (skip > 0 and hasattr(self.sampler, "start_at") and batch_size is not None
                and getattr(self.loader, "num_workers", 0) == 0)
        if fast:
            self.sampler.start_at(skip * batch_size)
        self._it = iter(self.loader)
        if not fast:  # draw the same batches again and drop them
            for _ in range(skip):
                next(self._it)

    def replay(self) -> None:
        """Recreate the pass a checkpoint was saved in, positioned after its consumed batches."""
        self._start_pass(replay=True)

    def __next__(self):
        if self._it is None:
            self._start_pass(replay=False)
        try:
            batch = next(self._it)
        except StopIteration:
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
            self._start_pass(replay=False)
            try:
                batch = next(self._it)
            except StopIteration:
                raise ValueError("the loader produced no batches") from None
        self.state.batch_in_epoch += 1
        x, y = batch
        # non_blocking overlaps the copy with compute when the loader pins memory (CUDA).
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)


def _total_steps(loader, steps, epochs, grad_accum_steps) -> int:
    if (steps is None) == (epochs is None):
        raise ValueError("give exactly one of steps= (optimizer steps) or epochs=")
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be at least 1, got {grad_accum_steps}")
    if steps is not None:
        return steps
    # Accumulation runs across pass boundaries: epochs * batches micro-batches in all.
    return epochs * len(loader) // grad_accum_steps


def train(model, loader, optimizer, *, steps: int | None = None, epochs: int | None = None,
          device=None, amp: AutocastRecipe | bool | None = None, grad_accum_steps: int = 1,
          clip_norm: float | None = None, loss_fn=cross_entropy, checkpoint_path=None,
          checkpoint_every: int | None = None, resume: bool = False,
          progress: bool = True) -> History:
    """Train `model` on (x, y) batches from `loader` until `steps` optimizer steps (in all,
    counting steps before a resume) or `epochs` passes; return the loss of every step.

    device: default gpulab.runner.device; the model is moved there.
    amp: None for fp32, an AutocastRecipe (gpulab.runner.autocast), or True for the runner's.
    grad_accum_steps: micro-batches per optimizer step (effective batch = that x batch size).
    clip_norm: clip the gradients' global L2 norm to this before each step.
    checkpoint_path / checkpoint_every: save every that many steps and at the end.
    resume: continue from checkpoint_path if the file exists (else start at step 0), so the same
        call starts a run or picks up a preempted one. The resumed run repeats the uninterrupted
        one bit for bit (same losses, same weights), given the same loader settings; with
        persistent_workers, only if the dataset's items involve no randomness.
    """
    start_time = time.perf_counter()
    if device is None:
        import gpulab

        device = gpulab.runner.device
    device = torch.device(device)
    recipe = resolve_amp(amp, device)
    total = _total_steps(loader, steps, epochs, grad_accum_steps)
    if (checkpoint_every or resume) and checkpoint_path is None:
        raise ValueError("checkpoint_every and resume need a checkpoint_path")
    model.to(device)
    # A disabled GradScaler passes everything through: one code path for fp32, bf16 and fp16.
    scaler = torch.amp.GradScaler(device.type,
                                  enabled=recipe is not None and recipe.use_grad_scaler)
    state = TrainState()
    batches = _Batches(loader, state, device)
    if resume and Path(checkpoint_path).exists():
        # Read onto the CPU: load_state_dict copies each tensor to its parameter's device, keeps
        # the optimizer's step counts on the CPU where Adam expects them, and spares the GPU a
        # second copy of the weights during the load.
        state = load_checkpoint(checkpoint_path, model, optimizer, scaler, map_location="cpu")
        batches = _Batches(loader, state, device)
        batches.replay()  # uses the epoch-start generators, so it comes before...
        restore_rng_state(state.rng)  # ...the generators as they were when the file was saved
    resumed_from = state.step
    model.train()
    pending = []  # this call's losses, left on the device until needed (no sync per step)
    bar = tqdm(total=total, initial=state.step, disable=not progress, unit="step", desc="train")
    while state.step < total:
        optimizer.zero_grad(set_to_none=True)
        step_loss = None
        for _ in range(grad_accum_steps):
            x, y = next(batches)
            with autocast(recipe):  # forward and loss in low precision; backward outside
                loss = loss_fn(model(x), y) / grad_accum_steps
            scaler.scale(loss).backward()  # grads add up in .grad across micro-batches
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        if clip_norm is not None:
            scaler.unscale_(optimizer)  # divide by S first, or the clip sees S-times-too-big grads
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        scaler.step(optimizer)
        scaler.update()
        state.step += 1
        pending.append(step_loss)
        bar.update()
        if progress and state.step % SHOW_LOSS_EVERY == 0:
            bar.set_postfix(loss=f"{step_loss.item():.4f}", refresh=False)
        last = state.step == total
        if checkpoint_path is not None and (last or (checkpoint_every
                                                     and state.step % checkpoint_every == 0)):
            _flush(pending, state)
            save_checkpoint(checkpoint_path, model, optimizer, scaler, state)
    _flush(pending, state)
    bar.close()
    return History(state.losses, resumed_from, time.perf_counter() - start_time)


def _flush(pending: list, state: TrainState) -> None:
    """Move pending device-side losses into state.losses as floats (one sync for all of them)."""
    if pending:
        state.losses.extend(torch.stack(pending).float().cpu().tolist())
        pending.clear()


@dataclass(frozen=True)
class OverfitResult:
    """The memorization test: can the model drive the loss on one batch to near zero?"""

    final_loss: float  # loss on the batch after training, in eval mode (no dropout)
    passed: bool  # final_loss < threshold
    losses: list[float]  # the training losses, one per step
    threshold: float


def overfit_one_batch(model, batch, optimizer=None, steps: int = 200, lr: float = 3e-3,
                      threshold: float = 0.05, device=None, amp=None,
                      loss_fn=cross_entropy) -> OverfitResult:
    """Train on the single (x, y) `batch` for `steps` steps (Adam(lr) unless `optimizer`).

    A model that cannot memorize a handful of examples has a bug (wrong targets, a detached
    graph, a mask that hides the answer, a learning rate of 0), whatever the full run says.
    """
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    history = train(model, [batch], optimizer, steps=steps, device=device, amp=amp,
                    loss_fn=loss_fn, progress=False)
    device = next(model.parameters()).device
    recipe = resolve_amp(amp, device)
    x, y = (t.to(device) for t in batch)
    model.eval()
    with torch.no_grad(), autocast(recipe):
        final = loss_fn(model(x), y).float().item()
    model.train()
    return OverfitResult(final, final < threshold, history.losses, threshold)

