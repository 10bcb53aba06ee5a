"""Lab 2, Part 2: one mixed-precision training step with a GradScaler and clipping
(check_amp_step).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""



from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import (
    BF16,
    BF16_SCALED,
    LR,
    SCALE,
    UPDATE_RTOL,
    StepWatch,
    as_loss,
    call_learner,
    check_backward_outside_autocast,
    check_loss,
    fill_stale_grads,
    make_scaler,
    one_thread,
    param_copies,
    scaler_name,
    tiny_problem,
)


def _reference_step(start, x, y, recipe, clip_norm, mistake: str | None = None):
    """The checker's amp step on a copy of `start` (or the step with a known `mistake`):
    (parameters after, loss, scale after)."""
    model = copy.deepcopy(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = make_scaler(recipe.use_grad_scaler)
    if mistake == "stale":
        fill_stale_grads(model, SCALE if recipe.use_grad_scaler else 1.0)
    with torch.autocast(recipe.device_type, dtype=recipe.dtype):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if clip_norm is not None and mistake != "no_clip":
        if mistake != "clip_before_unscale":
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    if mistake == "direct_step":
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    return param_copies(model), float(loss.detach()), scaler.get_scale()


_AMP_MISTAKES = {  # mistake -> (applies to (scaler on, clipping), what to say)
    "clip_before_unscale": (lambda on, clip: on and clip,
                            "The update is about {S:g} times too small ({sizes}): the gradients "
                            "were clipped while still multiplied by the scale S = {S:g}, then "
                            "divided by S. Call scaler.unscale_(optimizer) before "
                            "clip_grad_norm_, so that the clip sees the true gradients."),
    "no_clip": (lambda on, clip: clip,
                "The gradients were not clipped ({sizes}): with clip_norm given, the step must "
                "clip the true gradients' global norm to clip_norm (unscale them first), "
                "before scaler.step."),
    "direct_step": (lambda on, clip: on and not clip,
                    "The update is {S:g} times too big ({sizes}): optimizer.step() used "
                    "gradients still multiplied by S = {S:g}. Step with scaler.step(optimizer): "
                    "it unscales them first, and skips the step when they hold inf or NaN."),
    "stale": (lambda on, clip: True,
              "The update includes the gradients that were in .grad before the call "
              "({sizes}): start the step with optimizer.zero_grad(set_to_none=True), since "
              "backward adds into .grad."),
}


def _largest(deltas) -> float:
    return max(float(d.abs().max()) for d in deltas)


def _check_update(before, after, want, start, x, y, recipe, clip_norm, case: str) -> None:
    """The step moved the parameters from `before` to `after`; the reference, to `want`."""
    got_delta = [a - b for a, b in zip(after, before, strict=True)]
    want_delta = [w - b for w, b in zip(want, before, strict=True)]
    err = rel_err(got_delta, want_delta)
    if err <= UPDATE_RTOL:
        return
    if all(not d.any() for d in got_delta):
        raise AssertionError(
            f"amp_step ({case}): the parameters did not move. Is optimizer.zero_grad() "
            "between backward and the step (it erases the gradients)? Does the step go "
            "through scaler.step(optimizer), with the optimizer passed in?")
    for mistake, (applies, hint) in _AMP_MISTAKES.items():
        if not applies(recipe.use_grad_scaler, clip_norm is not None):
            continue
        alt, _, _ = _reference_step(start, x, y, recipe, clip_norm, mistake)
        if rel_err(got_delta, [a - b for a, b in zip(alt, before, strict=True)]) <= UPDATE_RTOL:
            sizes = (f"max |dw| = {_largest(got_delta):.3g}, one SGD step on the true "
                     f"gradient: {_largest(want_delta):.3g}")
            raise AssertionError(f"amp_step ({case}): {hint.format(S=SCALE, sizes=sizes)}")
    raise AssertionError(
        f"amp_step ({case}): the parameters moved differently from one SGD step (lr={LR}) on "
        f"the true gradient of the loss: off by {err:.0%} of the largest change (max |dw| = "
        f"{_largest(got_delta):.3g}, expected {_largest(want_delta):.3g}). Follow the "
        "gradients through the step: are they the true ones, or S times them, where each call "
        "reads them?")


def _check_scale(scaler, want: float, case: str) -> None:
    got = scaler.get_scale()
    if got == want:
        return
    why = "halves it when the gradients held inf" if want < SCALE else (
        "grows it after growth_interval clean steps (1 here)")
    if got == SCALE:
        raise AssertionError(
            f"amp_step ({case}): the scale is still {SCALE:g} after the step, expected "
            f"{want:g}: scaler.update() was not called on the scaler passed in. After "
            f"scaler.step(optimizer), scaler.update() {why}.")
    raise AssertionError(f"amp_step ({case}): the scale is {got:g} after the step, expected "
                         f"{want:g}: call scaler.update() once per step, after scaler.step.")


def _amp_case(amp_step, recipe, clip: bool, poison: bool, seed: int) -> None:
    start, x, y = tiny_problem(seed, n=16)
    clip_norm = None
    if clip:  # half the gradient's norm, so that the clip must act
        probe = copy.deepcopy(start)
        F.cross_entropy(probe(x), y).backward()
        clip_norm = 0.5 * float(torch.nn.utils.clip_grad_norm_(probe.parameters(), math.inf))
    if poison:
        x[3, 0] = math.inf  # one bad input: the loss and every gradient become NaN
    on = recipe.use_grad_scaler
    case = (f"bf16 autocast, {scaler_name(on)}, "
            f"clip_norm={'None' if clip_norm is None else f'{clip_norm:.3g}'}"
            f"{', an inf in the batch' if poison else ''}")
    model = copy.deepcopy(start)
    fill_stale_grads(model, SCALE if on else 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = make_scaler(on)
    with StepWatch(recipe.device_type) as watch:
        value = call_learner(amp_step, "amp_step", model, optimizer, scaler, x.clone(), y.clone(),
                      recipe, clip_norm, case=case)
    got_loss = as_loss(value, "amp_step", case)
    before, after = param_copies(start), param_copies(model)
    if poison:
        nan = sum(bool(p.isnan().any()) for p in after)
        if nan:
            raise AssertionError(
                f"amp_step ({case}): {nan} of {len(after)} parameter tensors became NaN: the "
                "step ran on gradients that held inf/NaN. scaler.step(optimizer) checks the "
                "unscaled gradients and skips the step when they do; optimizer.step() does "
                "not.")
        moved = _largest([a - b for a, b in zip(after, before, strict=True)])
        if moved:
            raise AssertionError(
                f"amp_step ({case}): the weights moved on the overflowing step (max |dw| = "
                f"{moved:.3g}); the step must be skipped: let scaler.step(optimizer) decide, "
                "after any unscale and clip.")
        want_scale = SCALE / 2
    else:
        with torch.no_grad():
            fp32 = float(F.cross_entropy(start(x), y))
        want, want_loss, want_scale = _reference_step(start, x, y, recipe, clip_norm)
        check_loss(got_loss, want_loss, fp32, "amp_step", case, SCALE if on else 1.0, watch)
        _check_update(before, after, want, start, x, y, recipe, clip_norm, case)
    if on:
        _check_scale(scaler, want_scale, case)
    check_backward_outside_autocast(watch, "amp_step", case)


@one_thread()
def check_amp_step(amp_step, clip: bool = True, seed: int = 0) -> None:
    """amp_step(model, optimizer, scaler, x, y, recipe, clip_norm) against the checker's step:
    bf16 autocast without a GradScaler, then with one (a clean batch, then one holding inf)."""
    require_own_function(amp_step, "amp_step")
    _amp_case(amp_step, BF16, clip, poison=False, seed=seed)
    _amp_case(amp_step, BF16_SCALED, clip, poison=False, seed=seed + 1)
    _amp_case(amp_step, BF16_SCALED, clip, poison=True, seed=seed + 1)


