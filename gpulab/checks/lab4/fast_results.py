"""Checkers for Lab 4, Part B: speed up a slow training pipeline
(solutions/lab4_memory_and_profiling/lab4_memory_and_profiling.ipynb).

    check_fast_results(fast_train)    B1  the same losses and final weights as slow_train
    (check_speedup, B2, is in speedup.py)

fast_train takes slow_train's arguments, (model, optimizer, images, labels, *, steps,
batch_size, seed), and returns what it returns: a list of `steps` Python floats. Each checker
builds the problem itself (gpulab.slow_pipeline), runs slow_train and fast_train from identical
fresh models and optimizers, and compares plain numbers. A known mistake on the first step (the
order of the examples, the transform, a summed loss, the batch size) is recognized by computing
what it would have given.

Taught in: Lab 4 (and lessons/08_profiling_and_optimization.ipynb)
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import call_learner, one_thread, param_copies
from gpulab.slow_pipeline import (
    BATCH_SIZE,
    MICRO_BATCH_SIZE,
    example_order,
    pipeline_problem,
    slow_train,
)

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6  # summed in another order, float32: ~1e-6 apart in practice
TIGHT_RTOL = 2e-6  # step 0 alone: one forward pass, ~1e-7 apart; used to name a mistake only
PARAM_RTOL = 1e-4  # final weights, as a fraction of the largest weight
RESULT_STEPS = 40  # with 64 a step, crosses the end of the first pass over the 1,797 digits
SIGNATURE = "(model, optimizer, images, labels, *, steps, batch_size, seed)"


# ----------------------------------------------------------------------------- running it


@contextmanager
def full_fp32():
    """fp32 matmuls in full precision while checking, whatever the notebook set: TF32
    (torch.set_float32_matmul_precision("high")) moves results by about 0.1% on a GPU, far more
    than summing in another order does. The learner's setting comes back after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _run(train, problem, name: str, case: str):
    """train on a fresh model and optimizer and copies of the data: (value, model, initial
    parameters). An error becomes an AssertionError that says what to look at."""
    model = problem.new_model()
    optimizer = problem.new_optimizer(model)
    before = param_copies(model)
    images, labels = problem.images.clone(), problem.labels.clone()
    call = functools.partial(train, steps=problem.steps, batch_size=problem.batch_size,
                             seed=problem.seed)
    try:
        value = call_learner(call, name, model, optimizer, images, labels, case=case)
    except AssertionError as error:
        if "TypeError" in str(error) and "argument" in str(error):
            raise AssertionError(f"{error}\n{name} must take slow_train's arguments: "
                                 f"{name}{SIGNATURE}.") from error
        raise
    if torch.get_float32_matmul_precision() != "highest":
        torch.set_float32_matmul_precision("highest")
        raise AssertionError(
            f"{name} ({case}) switched fp32 matrix multiplies to TF32 "
            "(set_float32_matmul_precision or allow_tf32): on a GPU that changes results by "
            "about 0.1%, so they could no longer match slow_train's. Leave the precision alone.")
    if not (torch.equal(images, problem.images) and torch.equal(labels, problem.labels)):
        raise AssertionError(f"{name} ({case}) changed the images or labels it was given, in "
                             "place. Leave the caller's data as it is: make new tensors from it.")
    return value, model, before


def as_losses(value, steps: int, batch_size: int, case: str) -> list[float]:
    if isinstance(value, torch.Tensor):
        raise AssertionError(
            f"fast_train ({case}) returned a tensor; return what slow_train returns, a list of "
            "Python floats: keep each step's loss as a detached tensor in a list, and convert "
            "them all once, after the loop, with torch.stack(losses).tolist().")
    if not isinstance(value, list | tuple):
        raise AssertionError(f"fast_train ({case}) returned {type(value).__name__}; return a "
                             "list with one float per step, as slow_train does.")
    if any(isinstance(v, torch.Tensor) for v in value):
        raise AssertionError(
            f"fast_train ({case}) returned a list of tensors; return Python floats, as "
            "slow_train does: convert them all at once after the loop, "
            "torch.stack(losses).tolist() (one wait for the device instead of one per step).")
    if len(value) != steps:
        per_micro = len(value) == steps * (batch_size // MICRO_BATCH_SIZE)
        raise AssertionError(
            f"fast_train ({case}) returned {len(value)} losses for steps={steps}: one loss per "
            "optimizer step, each the mean over that step's batch_size examples"
            + (" (not one per micro-batch)." if per_micro else "."))
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        kinds = sorted({type(v).__name__ for v in value})
        raise AssertionError(f"fast_train ({case}) returned a list of {', '.join(kinds)}; "
                             "return Python floats.")
    return [float(v) for v in value]


def losses_close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=LOSS_RTOL, abs_tol=LOSS_ATOL)


def _tight(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=TIGHT_RTOL)


# ----------------------------------------------------------------------------- diagnosis


def _inputs(images: torch.Tensor, how: str) -> torch.Tensor:
    """The images as (N, 64) float32 model inputs: the right transform, or a known wrong one."""
    v = images.reshape(len(images), 64).float() / 16  # (N, 64), values in [0, 1]
    if how == "right":
        return (v - v.mean(1, keepdim=True)) / v.std(1, correction=0, keepdim=True)
    if how == "correction_1":
        return (v - v.mean(1, keepdim=True)) / v.std(1, keepdim=True)
    if how == "scaled_only":
        return v
    if how == "raw":
        return images.reshape(len(images), 64).float()
    if how == "whole_dataset":
        return (v - v.mean()) / v.std(correction=0)
    raise ValueError(how)


_TRANSFORM_HINTS = {
    "scaled_only": "the images were scaled to [0, 1] (pixel / 16) but not standardized: "
                   "subtract each image's mean and divide by its standard deviation.",
    "raw": "the raw pixels 0..16 went into the model: the transform is missing.",
    "correction_1": "the standard deviation divides by 63 (torch's default, correction=1); "
                    "slow_train's divides by 64: x.std(dim, correction=0).",
    "whole_dataset": "each image must be standardized with its own mean and standard "
                     "deviation (over its 64 values), not those of the whole data set.",
}


def _first_step_mistake(got: float, want: float, problem, close) -> str | None:
    """The known mistake that step 0's loss `got` matches (by `close`), or None; want is
    slow_train's."""
    n, batch_size = len(problem.labels), problem.batch_size
    order = torch.tensor(example_order(n, problem.steps, batch_size, problem.seed))
    model = problem.new_model()
    device = next(model.parameters()).device
    labels = problem.labels.to(device)

    def loss(how: str, idx: torch.Tensor) -> float:
        x = _inputs(problem.images, how).to(device)
        with torch.no_grad():
            return float(F.cross_entropy(model(x[idx]), labels[idx]))

    first = order[:batch_size]
    k = batch_size // MICRO_BATCH_SIZE
    if close(got, want * batch_size):
        return ("It is the batch's summed loss: return (and train on) the mean over the batch, "
                "F.cross_entropy's default reduction='mean'.")
    if k > 1 and close(got, want * k):
        return (f"It is the sum of the {k} micro-batches' mean losses; one step is one batch "
                f"of batch_size={batch_size} examples and its mean loss.")
    for how, hint in _TRANSFORM_HINTS.items():
        if close(got, loss(how, first)):
            return "The transform differs: " + hint
    if close(got, loss("right", torch.arange(batch_size))):
        return ("It is the loss of the first batch_size examples in the order they are stored: "
                "the examples must come in slow_train's order, the permutations drawn from "
                "torch.Generator().manual_seed(seed) (see example_order's docstring).")
    for size in sorted({MICRO_BATCH_SIZE, batch_size // 2, 2 * batch_size} - {batch_size}):
        if size <= n and close(got, loss("right", order[:size])):
            return (f"It is the mean loss over the first {size} examples of the order; a step "
                    f"uses batch_size={batch_size} examples.")
    return None


def _first_step_hint(got: float, want: float, problem) -> str:
    return _first_step_mistake(got, want, problem, losses_close) or (
        "The model has not been updated yet at step 0, so the difference is in the batch: "
        "which examples (slow_train's order: permutations from "
        "torch.Generator().manual_seed(seed)), their transform, or the loss (the mean "
        "cross-entropy over batch_size examples).")


def _later_step_hint(k: int, got0: float, want0: float, problem) -> str:
    # A transform that only rescales the inputs a little (a std divided by 63, not 64) barely
    # moves the fresh model's loss: step 0 passes the tolerance, and only later steps fail.
    # Step 0 agrees far more closely than the tolerance when the batch is right.
    if not _tight(got0, want0):
        mistake = _first_step_mistake(got0, want0, problem, _tight)
        if mistake:
            return (f"The difference began at step 0 ({got0:.7f}, expected {want0:.7f}: within "
                    f"the tolerance, but no closer). {mistake}")
    n, batch_size = len(problem.labels), problem.batch_size
    first_straddling = n // batch_size  # the first step with an example of the second pass
    if k == first_straddling:
        return (f"Step {k} is the first to use the second pass over the data. Draw every pass's "
                "permutation from one generator, seeded once (never re-seeded), and cut the "
                "concatenated passes into batches: a batch may straddle two passes.")
    return ("Step 0 agrees, so the first batch, the transform and the loss look right; what "
            "differs is the update or a later batch. Each step: zero the gradients, one "
            "backward of the batch's mean loss, one optimizer.step(); and the examples follow "
            "slow_train's order throughout.")


def _compare(got: list[float], model, before, want: list[float], want_model, problem,
             case: str) -> None:
    unchanged = all(torch.equal(a, b) for a, b in zip(param_copies(model), before, strict=True))
    bad = next((k for k, (g, w) in enumerate(zip(got, want, strict=True))
                if not losses_close(g, w)), None)
    if unchanged and (bad is None or bad > 0):
        raise AssertionError(
            f"fast_train ({case}): the model's parameters did not change. Train the model you "
            "are given (not a copy) with the optimizer you are given: backward, then "
            "optimizer.step(), every step.")
    if bad is not None:
        hint = (_first_step_hint(got[0], want[0], problem) if bad == 0
                else _later_step_hint(bad, got[0], want[0], problem))
        raise AssertionError(
            f"fast_train ({case}): step {bad} is the first whose loss differs: {got[bad]:.6f}, "
            f"expected {want[bad]:.6f} (slow_train's). {hint}")
    err = rel_err(param_copies(model), param_copies(want_model))
    if err > PARAM_RTOL:
        raise AssertionError(
            f"fast_train ({case}): every loss agrees, but the final weights differ from "
            f"slow_train's by {err:.2g} of the largest weight. The loss of a step is computed "
            "before its update: is the last step's optimizer.step() missing, or one too many?")


@one_thread()
@full_fp32()
def check_fast_results(fast_train, seed: int = 0, steps: int = RESULT_STEPS,
                       batch_size: int = BATCH_SIZE) -> None:
    """fast_train and slow_train, from the same fresh model and optimizer, give the same
    losses (within LOSS_RTOL) and the same final weights (within PARAM_RTOL). batch_size must
    be a multiple of MICRO_BATCH_SIZE (slow_train's micro-batches)."""
    require_own_function(fast_train, "fast_train")
    problem = pipeline_problem(seed=seed, steps=steps, batch_size=batch_size)
    case = f"seed={seed}, steps={steps}, batch_size={batch_size}"
    want, want_model, _ = _run(slow_train, problem, "slow_train", case)
    value, model, before = _run(fast_train, problem, "fast_train", case)
    got = as_losses(value, steps, problem.batch_size, case)
    _compare(got, model, before, want, want_model, problem, case)
