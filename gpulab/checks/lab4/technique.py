"""Lab 4, Part B3: fast_train removes the syncs, the copies and the micro-batches, not only the
time (check_fast_technique).

A CPU hides what a GPU would pay for: a sync there has nothing to wait for, a copy "to the
device" is no copy at all, and a forward pass of 8 examples costs a CPU little more per example
than one of 64, where a GPU pays each pass's kernel launches. So the technique is graded from
counts, the same on either runner: count_transfers (gpulab/profiling/transfers.py) and the
forward passes of the model, over one whole call of fast_train, per step. One-off work before
the loop (the data set copied once, the losses converted once at the end) spreads over the
steps; whatever happens every step or every micro-batch does not.
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import functools
from collections import Counter
from contextlib import contextmanager

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import call_learner, one_thread
from gpulab.checks.lab4.fast_results import as_losses, full_fp32, losses_close
from gpulab.profiling.transfers import count_transfers
from gpulab.slow_pipeline import pipeline_problem, slow_train

TECHNIQUE_STEPS = 20
MAX_SYNCS_PER_STEP = 0.25  # well under one a step: the losses are read once, not every step
MAX_COPIES_PER_STEP = 2  # at most one batch's inputs and labels a step
MAX_FORWARDS_PER_STEP = 1  # the whole batch at once: 64 digits fit in any device's memory
MAX_WAITING_COPIES_PER_STEP = 0.25  # on a GPU: the copies made every step neither block nor
# come from pageable memory (one-off copies before the loop may)


@contextmanager
def forward_passes(model):
    """Counts the calls of each of model's modules that hold parameters of their own; yields the
    Counter. Its largest count is the number of forward passes, whether the learner called the
    model, one of its children or its layers one by one."""
    calls = Counter()
    handles = [module.register_forward_pre_hook(lambda m, _, name=name: calls.update((name,)))
               for name, module in model.named_modules()
               if any(True for _ in module.parameters(recurse=False))]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _counted(train, problem, case: str):
    """(losses, counts per step) of one call of train on a fresh model."""
    model = problem.new_model()
    optimizer = problem.new_optimizer(model)
    images, labels = problem.images.clone(), problem.labels.clone()
    call = functools.partial(call_learner, functools.partial(
        train, steps=problem.steps, batch_size=problem.batch_size, seed=problem.seed),
        "fast_train", model, optimizer, images, labels, case=case)
    value = []
    with forward_passes(model) as calls:
        counts = count_transfers(lambda: value.append(call()), model, steps=1)
    per_step = problem.steps
    return value[0], {"syncs": counts.syncs / per_step, "copies": counts.h2d_copies / per_step,
                      "bytes": counts.h2d_bytes / per_step,
                      "waiting": max(counts.pageable_copies, counts.blocking_copies) / per_step,
                      "forwards": max(calls.values(), default=0) / per_step}


def _table(theirs: dict, ours: dict) -> str:
    rows = (("syncs (the host waits for the device)", "syncs"),
            ("copies host -> device", "copies"), ("bytes copied host -> device", "bytes"),
            ("copies that block or come from pageable memory", "waiting"),
            ("forward passes of the model", "forwards"))
    return "per step, counted:\n" + f"  {'':<50}{'yours':>10}{'slow':>10}\n" + "\n".join(
        f"  {text:<50}{theirs[key]:>10.2f}{ours[key]:>10.2f}" for text, key in rows)


@one_thread()
@full_fp32()
def check_fast_technique(fast_train, seed: int = 0, steps: int = TECHNIQUE_STEPS) -> None:
    """One call of fast_train, counted: slow_train's losses, at most MAX_SYNCS_PER_STEP syncs
    a step, at most MAX_COPIES_PER_STEP copies to the device a step, at most
    MAX_FORWARDS_PER_STEP forward passes a step, and on a GPU at most
    MAX_WAITING_COPIES_PER_STEP copies a step that block or come from pageable memory."""
    require_own_function(fast_train, "fast_train")
    problem = pipeline_problem(seed=seed, steps=steps)
    case = f"seed={seed}, steps={steps}, counted"
    want, ours = _counted(slow_train, problem, case)
    got, theirs = _counted(fast_train, problem, case)
    got = as_losses(got, steps, problem.batch_size, case)
    if not all(losses_close(g, w) for g, w in zip(got, want, strict=True)):
        raise AssertionError(f"fast_train ({case}) does not give slow_train's losses: the "
                             "technique counts only for the same results (see test_fast_results).")
    table = "\n" + _table(theirs, ours)
    if theirs["syncs"] > MAX_SYNCS_PER_STEP:
        raise AssertionError(
            f"fast_train made {theirs['syncs']:.2f} host-device syncs a step (slow_train "
            f"{ours['syncs']:.0f}); it may make at most {MAX_SYNCS_PER_STEP:g}. Each .item(), "
            ".cpu(), .tolist() or float() of a device tensor makes the host wait for the GPU. "
            "Keep each step's loss as a tensor and read them all once, after the loop." + table)
    if theirs["copies"] > MAX_COPIES_PER_STEP:
        raise AssertionError(
            f"fast_train copied to the device {theirs['copies']:.2f} times a step (slow_train "
            f"{ours['copies']:.0f}); it may copy at most {MAX_COPIES_PER_STEP} (a batch's inputs "
            "and labels). Many small copies each pay a fixed cost. The whole data set is small: "
            "it can go to the device once, before the loop." + table)
    if theirs["forwards"] > MAX_FORWARDS_PER_STEP:
        raise AssertionError(
            f"fast_train ran the model {theirs['forwards']:.2f} times a step (slow_train "
            f"{ours['forwards']:.0f}): micro-batches. It may run it at most "
            f"{MAX_FORWARDS_PER_STEP} time a step. On a GPU each pass launches its own small "
            f"kernels and the device idles between them; a batch of {problem.batch_size} digits "
            "fits at once, and its mean loss is the step's loss." + table)
    if problem.device.type == "cuda" and theirs["waiting"] > MAX_WAITING_COPIES_PER_STEP:
        raise AssertionError(
            f"fast_train made {theirs['waiting']:.2f} copies a step that block the host or come "
            "from pageable memory. Copy from pinned memory (.pin_memory(), or DataLoader("
            "pin_memory=True)) with .to(device, non_blocking=True), or copy the data set once, "
            "before the loop." + table)
