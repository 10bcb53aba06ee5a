"""Profile a few training steps with torch.profiler, each step labelled by phase.

    result = profile_steps(model, loader, optimizer, steps=5)     # gpulab's training step
    result = profile_steps(my_step, steps=5)                      # or any step function

A step function takes no arguments and does one step; label its parts with phase() so the
step splits exactly into data loading, forward, backward and optimizer time:

    def my_step():
        with phase("data"):
            x, y = next(batches)
        with phase("forward"):
            loss = F.cross_entropy(model(x), y)
        ...

The profiler runs on a schedule: `wait` steps untraced, `warmup` steps traced and thrown away
(first-call costs, the profiler's own start-up), then `steps` recorded steps.
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import os
import tempfile
import warnings
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from gpulab.profiling.result import ProfileResult
from gpulab.profiling.trace import PHASES, profiled_events, records_from_events
from gpulab.train import autocast, cross_entropy, resolve_amp

KINETO_QUIET = "6"  # above every Kineto log level (ERROR is 4, its start/stop notices 5)


@contextmanager
def phase(name: str, sync: bool = False):
    """Label a part of a step as one of PHASES for the profiler (a record_function range).

    sync=True waits for the GPU at the end of the phase, so the phase's wall time includes the
    device work it queued. Without it, on a GPU, a phase's time is how long the host took to
    queue the work, and the wait shows up wherever the next sync happens."""
    if name not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {name!r}")
    with record_function(name):
        yield
        if sync and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()


def _forever(loader):
    """Batches from `loader`, pass after pass."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader produced no batches")


def labelled_training_step(model, loader, optimizer, device=None, amp=None,
                           loss_fn=cross_entropy):
    """A step function doing one step of gpulab.train's loop (no accumulation, no clipping),
    each part labelled with its phase. On a GPU each phase ends with a sync, so that its time
    is the device's time: the price is that host and device no longer overlap across phases.

    amp: None (fp32), True (the runner's recipe) or an AutocastRecipe, as in gpulab.train."""
    if device is None:
        import gpulab

        device = gpulab.runner.device
    device = torch.device(device)
    recipe = resolve_amp(amp, device)
    model.to(device)
    model.train()
    scaler = torch.amp.GradScaler(device.type,
                                  enabled=recipe is not None and recipe.use_grad_scaler)
    batches = _forever(loader)
    sync = device.type == "cuda"

    def step():
        with phase("data", sync):
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with phase("forward", sync):
            with autocast(recipe):  # forward and loss only, never backward
                loss = loss_fn(model(x), y)
        with phase("backward", sync):
            scaler.scale(loss).backward()
        with phase("optimizer", sync):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def profile_steps(step_fn, loader=None, optimizer=None, *, steps: int = 5, warmup: int = 2,
                  wait: int = 0, device=None, amp=None, loss_fn=cross_entropy,
                  record_shapes: bool = True, with_flops: bool = True,
                  with_stack: bool = False) -> ProfileResult:
    """Run `wait + warmup + steps` steps under torch.profiler and return what the last `steps`
    recorded (a ProfileResult).

    step_fn: a function of no arguments doing one step (label it with phase()), or a model,
        with `loader` and `optimizer`: then the step is labelled_training_step(model, loader,
        optimizer, device, amp, loss_fn).
    device: where the step runs (default gpulab.runner.device); on "cuda" the profiler records
        CUDA kernels too and each step ends with a sync, so a step's time is the GPU's. (On
        "mps" or "xpu" only the host's side is recorded.)
    record_shapes, with_flops: needed for the FLOP and byte counts behind regime().
    with_stack: record Python call stacks too (slower, larger traces; the trace then links
        each op to its line of code)."""
    if device is None:
        import gpulab

        device = gpulab.runner.device
    device = torch.device(device)
    if isinstance(step_fn, torch.nn.Module):
        if loader is None or optimizer is None:
            raise ValueError("profiling a model needs its loader and optimizer: "
                             "profile_steps(model, loader, optimizer)")
        step_fn = labelled_training_step(step_fn, loader, optimizer, device, amp, loss_fn)
    elif loader is not None or optimizer is not None:
        raise ValueError("pass loader and optimizer with a model only; a step function "
                         "already knows its data and optimizer")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # Kineto, the profiler's tracing library, prints two time-stamped lines ("USDT: ...
    # profiler_start") every run, which land in notebook cells. It reads this variable when it
    # first starts; a value the user set wins. (It silences Kineto's errors too: the check for
    # missing CUDA kernels below stands in for the one that matters, CUPTI's permission.)
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
    captured = {}

    def on_trace_ready(prof):
        # Called once, at the end of the recorded steps: keep plain records and the JSON.
        captured["records"] = records_from_events(profiled_events(prof))
        fd, tmp = tempfile.mkstemp(suffix=".json", prefix="gpulab_trace_")
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            with open(tmp, encoding="utf-8") as f:
                captured["json"] = f.read()
        finally:
            os.remove(tmp)

    with torch.profiler.profile(
            activities=activities, record_shapes=record_shapes, with_flops=with_flops,
            with_stack=with_stack, on_trace_ready=on_trace_ready, acc_events=True,
            schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1)) as prof:
        for _ in range(wait + warmup + steps):
            step_fn()
            if device.type == "cuda":  # the step ends when its kernels do, not when queued
                torch.cuda.synchronize(device)
            prof.step()
    step_spans, phase_spans, ops, kernels = captured["records"]
    if device.type == "cuda" and not kernels:
        warnings.warn("the profiler recorded no CUDA kernels. Either the step ran nothing on "
                      "the GPU, or CUPTI may not read the GPU's activity here (on some cloud "
                      "machines it needs the driver option NVreg_RestrictProfilingToAdminUsers=0 "
                      "or root). To see the tracer's own warnings, set KINETO_LOG_LEVEL=2 "
                      "before the first profile.", stacklevel=2)
    return ProfileResult(device=device.type, steps=step_spans, phase_spans=phase_spans,
                         ops=ops, kernels=kernels, trace_json=captured["json"])
