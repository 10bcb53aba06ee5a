"""Lab 2, Part 3: gradient accumulation over micro-batches of different sizes
(check_accumulate_gradients).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb, lessons/07_gpu_memory.ipynb
"""



from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import (
    AMP_RTOL,
    BF16,
    BF16_SCALED,
    GRAD_RTOL,
    SCALE,
    StepWatch,
    as_loss,
    call_learner,
    check_backward_outside_autocast,
    check_loss,
    fill_stale_grads,
    make_scaler,
    one_thread,
    scaler_name,
    tiny_problem,
)


def _grads(start, x, y, recipe, weight: float, scale: float):
    """Gradients of weight * mean loss on (x, y), times `scale`; and that loss (amp, fp32)."""
    model = copy.deepcopy(start)
    with torch.autocast(recipe.device_type, dtype=recipe.dtype):
        loss = F.cross_entropy(model(x), y) * weight
    (loss * scale).backward()
    with torch.no_grad():
        fp32 = float(F.cross_entropy(start(x), y)) * weight
    return [p.grad.clone() for p in model.parameters()], float(loss.detach()), fp32


def _accumulation_mistakes(start, batches, recipe, scale, want, sizes):
    """(what the gradients would be, what to say) for each known way to get accumulation
    wrong that differs from the right answer here."""
    n, k = sum(sizes), len(sizes)
    parts = [_grads(start, x, y, recipe, 1.0, scale)[0] for x, y in batches]  # mean grads
    summed = [sum(g) for g in zip(*parts, strict=True)]
    last = [g * sizes[-1] / n for g in parts[-1]]
    found = [(summed,
              f"The gradient is the sum of the micro-batches' mean gradients, about {k} times "
              f"the batch's: multiply each micro-batch's loss by its share of the batch, "
              f"len(x) / N (N = {n} examples in all), before backward.")]
    if len(set(sizes)) > 1:
        shares = ", ".join(f"{s}/{n}" for s in sizes)
        found.append(([g / k for g in summed],
                      f"Each micro-batch's loss was divided by the number of micro-batches "
                      f"({k}), so each counts 1/{k}, while their shares of the {n} examples "
                      f"are {shares}. That is right only when they are all the same size: the "
                      f"small ones count too much. Weight each loss by its share, len(x) / N "
                      f"(N = {n})."))
    lonely = ("Only the last micro-batch's gradient is left: the gradients were zeroed inside "
              "the loop. Zero them once, before the first micro-batch: backward adds into "
              ".grad, which is what accumulation relies on.")
    if k > 1:
        found += [(last, lonely), ([g / k for g in parts[-1]], lonely), (parts[-1], lonely)]
    if scale != 1:
        found.append(([g / scale for g in want],
                      f"The gradients are {scale:g} times too small: backward ran on the loss "
                      "itself. Run it on scaler.scale(loss); the step unscales them later."))
    found.append(([g + scale for g in want],
                  "The gradients include what was in .grad before the call: zero them first "
                  "(model.zero_grad(set_to_none=True)), then let backward add up the "
                  "micro-batches."))
    return found


@one_thread()
def check_accumulate_gradients(accumulate_gradients, sizes=(16, 8, 4), seed: int = 0) -> None:
    """accumulate_gradients(model, micro_batches, scaler, recipe) leaves in .grad the gradient
    of the whole batch's mean loss times the scale, and returns that loss; micro-batches of
    unequal sizes, with a GradScaler and without."""
    require_own_function(accumulate_gradients, "accumulate_gradients")
    sizes = tuple(int(s) for s in sizes)
    for recipe in (BF16_SCALED, BF16):
        scale = SCALE if recipe.use_grad_scaler else 1.0
        start, x, y = tiny_problem(seed, n=sum(sizes))
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        batches = [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        case = (f"micro-batches of {list(sizes)} examples, bf16 autocast, "
                f"{scaler_name(scale != 1)}")
        model = copy.deepcopy(start)
        fill_stale_grads(model, scale)
        with StepWatch(recipe.device_type) as watch:
            value = call_learner(accumulate_gradients, "accumulate_gradients", model,
                          [(a.clone(), b.clone()) for a, b in batches], make_scaler(scale != 1),
                          recipe, case=case)
        want, want_loss, fp32 = _grads(start, x, y, recipe, 1.0, scale)
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        if missing:
            raise AssertionError(f"accumulate_gradients ({case}): {missing[0]} has no gradient "
                                 "afterwards: run backward on every micro-batch's loss, and "
                                 "do not zero the gradients after the last one.")
        got = [p.grad.detach().clone() for p in model.parameters()]
        err = rel_err(got, want)
        if err > GRAD_RTOL:
            for alt, hint in _accumulation_mistakes(start, batches, recipe, scale, want, sizes):
                if rel_err(got, alt) <= GRAD_RTOL:
                    raise AssertionError(f"accumulate_gradients ({case}): {hint} (The "
                                         f"gradients are off by {err:.0%} of the largest "
                                         "entry.)")
            raise AssertionError(
                f"accumulate_gradients ({case}): the gradients differ from those of the whole "
                f"batch's mean loss by {err:.0%} of the largest entry. Compare what each "
                "micro-batch adds to .grad with its share of the whole batch's examples.")
        got_loss = as_loss(value, "accumulate_gradients", case)
        micro_sum = sum(_grads(start, a, b, recipe, 1.0, 1.0)[1] for a, b in batches)
        if len(sizes) > 1 and math.isclose(got_loss, micro_sum, rel_tol=AMP_RTOL / 3):
            raise AssertionError(
                f"accumulate_gradients ({case}) returned {got_loss:.4f}, the sum of the "
                f"micro-batches' mean losses; return the batch's mean loss ({want_loss:.4f}): "
                "the sum of the weighted losses, each detached.")
        check_loss(got_loss, want_loss, fp32, "accumulate_gradients", case, scale, watch)
        check_backward_outside_autocast(watch, "accumulate_gradients", case)
