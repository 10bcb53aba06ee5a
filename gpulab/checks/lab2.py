"""Checkers for Lab 2, from CPU to GPU training with AMP
(solutions/lab2_amp_training/lab2_amp_training.ipynb).

Each checker builds its own small model, batches, optimizer and GradScaler, runs the learner's
function on them, and compares what happened (parameters, gradients, the scale, the random
state) with a reference computed here. A known mistake is recognized by computing what it would
have produced, and the message says which line to look at.

    check_to_device(to_device)                         Part 1  batches on the device
    check_amp_step(amp_step)                           Part 2  autocast, GradScaler, clipping
    check_accumulate_gradients(accumulate_gradients)   Part 3  micro-batches add up to the batch

Parts 4 and 5 (resume, memorize) are in lab2_resume.py; the shared tools in training.py.

Everything runs on the CPU, on either runner: placement is graded on the `meta` device (shapes
and no data; every PyTorch has it), precision in bf16. Where the GradScaler's logic is graded, a
scaler is switched on next to bf16: it does the same algebra on CPU tensors (scale, unscale,
skip the step on inf, grow and back off). fp16 never runs here: a CPU emulates it, ~100x slower.
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""


from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from gpulab.checks.training import (
    AMP_RTOL,
    BF16,
    BF16_SCALED,
    GRAD_RTOL,
    LR,
    SCALE,
    UPDATE_RTOL,
    _as_loss,
    _call,
    _check_backward_outside_autocast,
    _check_loss,
    _fill_stale,
    _one_thread,
    _params,
    _problem,
    _rel_err,
    _require_own_function,
    _scaler,
    _scaler_name,
    _Watch,
)

# ----------------------------------------------------------------------------- Part 1


def _describe_mismatch(got, given, path: str, device: torch.device) -> str | None:
    """What is wrong with `got` as `given` moved to `device`, or None."""
    if isinstance(given, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path} came back as a {type(got).__name__}, expected a tensor on {device}."
        if got.device != device:
            deep = "" if path == "batch" else (" Recurse: a tensor inside a dict, list or "
                                               "tuple must move too, at any depth.")
            return f"{path} is on {got.device}, expected {device}.{deep}"
        if got.dtype != given.dtype or got.shape != given.shape:
            return (f"{path} is {got.dtype} {tuple(got.shape)}, expected {given.dtype} "
                    f"{tuple(given.shape)}: move it, do not convert it (.to(device) only).")
        return None
    if isinstance(given, dict | list | tuple):
        if type(got) is not type(given):
            return (f"{path} is a {type(got).__name__}, expected a {type(given).__name__}: "
                    "keep each container's type, so that code which unpacks or indexes the "
                    "batch works on either device.")
        if isinstance(given, dict):
            if list(got) != list(given):
                return f"{path} has keys {list(got)}, expected {list(given)}."
            pairs = [(got[k], given[k], f"{path}[{k!r}]") for k in given]
        else:
            if len(got) != len(given):
                return f"{path} has {len(got)} items, expected {len(given)}."
            pairs = [(got[i], v, f"{path}[{i}]") for i, v in enumerate(given)]
        for g, v, where in pairs:
            found = _describe_mismatch(g, v, where, device)
            if found:
                return found
        return None
    if got is not given and (isinstance(got, torch.Tensor) or got != given):
        return (f"{path} was {given!r} and came back as {got!r}: leave what is not a tensor "
                "as it is.")
    return None


def _count_tensors(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return 1
    if isinstance(tree, dict):
        return sum(_count_tensors(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_count_tensors(v) for v in tree)
    return 0


def _to_device_cases(nested: bool) -> list:
    g = torch.Generator().manual_seed(7 if nested else 0)
    x = torch.randn(4, 3, generator=g)  # (B, F)
    y = torch.randint(0, 5, (4,), generator=g)  # (B,)
    mask = torch.rand(4, generator=g) > 0.5  # (B,) bool
    if not nested:
        return [(x, y), {"x": x, "y": y, "mask": mask}]
    return [x, [], [(x, y), (x, y)],
            {"inputs": (x, [y, mask]), "info": {"ids": y, "name": "batch-7", "n": 3,
                                                "none": None}}]


@_one_thread()
def check_to_device(to_device, nested: bool = False) -> None:
    """to_device(batch, device): every tensor of a batch (a tensor, or tuples, lists and dicts
    of them, nested) copied to `device` with non_blocking=True; containers keep their type and
    anything else comes back as it was. Graded on the `meta` device."""
    _require_own_function(to_device, "to_device")
    device = torch.device("meta")
    for batch in _to_device_cases(nested):
        case = f"a {type(batch).__name__} batch to {device}"
        with _Watch() as watch:
            got = _call(to_device, "to_device", batch, device, case=case)
        wrong = _describe_mismatch(got, batch, "batch", device)
        if wrong:
            raise AssertionError(f"to_device ({case}): {wrong}")
        slow = watch.copies.count(False)
        if slow:
            raise AssertionError(
                f"to_device ({case}): {slow} of {_count_tensors(batch)} tensor copies were not "
                "asynchronous: call .to(device, non_blocking=True). From pinned (page-locked) "
                "memory a copy to a CUDA GPU then runs while the GPU computes; without it the "
                "host waits for every copy.")


# ----------------------------------------------------------------------------- Part 2


def _reference_step(start, x, y, recipe, clip_norm, mistake: str | None = None):
    """The checker's amp step on a copy of `start` (or the step with a known `mistake`):
    (parameters after, loss, scale after)."""
    model = copy.deepcopy(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = _scaler(recipe.use_grad_scaler)
    if mistake == "stale":
        _fill_stale(model, SCALE if recipe.use_grad_scaler else 1.0)
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
    return _params(model), float(loss.detach()), scaler.get_scale()


_AMP_MISTAKES = {  # mistake -> (applies to (scaler on, clipping), what to say)
    "clip_before_unscale": (lambda on, clip: on and clip,
                            "The update is about {S:g} times too small: the gradients were "
                            "clipped while still multiplied by the scale S = {S:g}, then divided "
                            "by S. Call scaler.unscale_(optimizer) before clip_grad_norm_, so "
                            "that the clip sees the true gradients."),
    "no_clip": (lambda on, clip: clip,
                "The gradients were not clipped: with clip_norm given, call "
                "scaler.unscale_(optimizer), then torch.nn.utils.clip_grad_norm_("
                "model.parameters(), clip_norm), before scaler.step."),
    "direct_step": (lambda on, clip: on and not clip,
                    "The update is {S:g} times too big: optimizer.step() used gradients still "
                    "multiplied by S = {S:g}. Step with scaler.step(optimizer): it unscales "
                    "them first, and skips the step when they hold inf or NaN."),
    "stale": (lambda on, clip: True,
              "The update includes the gradients that were in .grad before the call: start "
              "the step with optimizer.zero_grad(set_to_none=True), since backward adds into "
              ".grad."),
}


def _check_update(before, after, want, start, x, y, recipe, clip_norm, case: str) -> None:
    """The step moved the parameters from `before` to `after`; the reference, to `want`."""
    got_delta = [a - b for a, b in zip(after, before, strict=True)]
    want_delta = [w - b for w, b in zip(want, before, strict=True)]
    err = _rel_err(got_delta, want_delta)
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
        if _rel_err(got_delta, [a - b for a, b in zip(alt, before, strict=True)]) <= UPDATE_RTOL:
            raise AssertionError(f"amp_step ({case}): {hint.format(S=SCALE)}")
    raise AssertionError(
        f"amp_step ({case}): the parameters moved differently from one SGD step (lr={LR}) on "
        f"the gradient of the loss: off by {err:.0%} of the largest change. Check the order: "
        "zero_grad, forward and loss under autocast, scaler.scale(loss).backward(), "
        "unscale_ and clip, scaler.step, scaler.update.")


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
    start, x, y = _problem(seed, n=16)
    clip_norm = None
    if clip:  # half the gradient's norm, so that the clip must act
        probe = copy.deepcopy(start)
        F.cross_entropy(probe(x), y).backward()
        clip_norm = 0.5 * float(torch.nn.utils.clip_grad_norm_(probe.parameters(), math.inf))
    if poison:
        x[3, 0] = math.inf  # one bad input: the loss and every gradient become NaN
    on = recipe.use_grad_scaler
    case = (f"bf16 autocast, {_scaler_name(on)}, "
            f"clip_norm={'None' if clip_norm is None else f'{clip_norm:.3g}'}"
            f"{', an inf in the batch' if poison else ''}")
    model = copy.deepcopy(start)
    _fill_stale(model, SCALE if on else 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = _scaler(on)
    with _Watch(recipe.device_type) as watch:
        value = _call(amp_step, "amp_step", model, optimizer, scaler, x.clone(), y.clone(),
                      recipe, clip_norm, case=case)
    got_loss = _as_loss(value, "amp_step", case)
    before, after = _params(start), _params(model)
    if poison:
        if any(p.isnan().any() for p in after):
            raise AssertionError(
                f"amp_step ({case}): the parameters became NaN: the step ran on gradients "
                "that held inf/NaN. scaler.step(optimizer) checks the unscaled gradients and "
                "skips the step when they do; optimizer.step() does not.")
        if not all(torch.equal(a, b) for a, b in zip(after, before, strict=True)):
            raise AssertionError(f"amp_step ({case}): the parameters changed although the "
                                 "gradients held inf: let scaler.step(optimizer) decide.")
        want_scale = SCALE / 2
    else:
        with torch.no_grad():
            fp32 = float(F.cross_entropy(start(x), y))
        want, want_loss, want_scale = _reference_step(start, x, y, recipe, clip_norm)
        _check_loss(got_loss, want_loss, fp32, "amp_step", case, SCALE if on else 1.0, watch)
        _check_update(before, after, want, start, x, y, recipe, clip_norm, case)
    if on:
        _check_scale(scaler, want_scale, case)
    _check_backward_outside_autocast(watch, "amp_step", case)


@_one_thread()
def check_amp_step(amp_step, clip: bool = True, seed: int = 0) -> None:
    """amp_step(model, optimizer, scaler, x, y, recipe, clip_norm) against the checker's step:
    bf16 autocast without a GradScaler, then with one (a clean batch, then one holding inf)."""
    _require_own_function(amp_step, "amp_step")
    _amp_case(amp_step, BF16, clip, poison=False, seed=seed)
    _amp_case(amp_step, BF16_SCALED, clip, poison=False, seed=seed + 1)
    _amp_case(amp_step, BF16_SCALED, clip, poison=True, seed=seed + 1)


# ----------------------------------------------------------------------------- Part 3


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
        found.append(([g / k for g in summed],
                      f"Each micro-batch's loss was divided by the number of micro-batches "
                      f"({k}). That is right only when they are all the same size; these have "
                      f"{list(sizes)} examples, so the small ones count too much. Multiply "
                      f"each loss by len(x) / N instead (N = {n})."))
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


@_one_thread()
def check_accumulate_gradients(accumulate_gradients, sizes=(16, 8, 4), seed: int = 0) -> None:
    """accumulate_gradients(model, micro_batches, scaler, recipe) leaves in .grad the gradient
    of the whole batch's mean loss times the scale, and returns that loss; micro-batches of
    unequal sizes, with a GradScaler and without."""
    _require_own_function(accumulate_gradients, "accumulate_gradients")
    sizes = tuple(int(s) for s in sizes)
    for recipe in (BF16_SCALED, BF16):
        scale = SCALE if recipe.use_grad_scaler else 1.0
        start, x, y = _problem(seed, n=sum(sizes))
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        batches = [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        case = (f"micro-batches of {list(sizes)} examples, bf16 autocast, "
                f"{_scaler_name(scale != 1)}")
        model = copy.deepcopy(start)
        _fill_stale(model, scale)
        with _Watch(recipe.device_type) as watch:
            value = _call(accumulate_gradients, "accumulate_gradients", model,
                          [(a.clone(), b.clone()) for a, b in batches], _scaler(scale != 1),
                          recipe, case=case)
        want, want_loss, fp32 = _grads(start, x, y, recipe, 1.0, scale)
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        if missing:
            raise AssertionError(f"accumulate_gradients ({case}): {missing[0]} has no gradient "
                                 "afterwards: run backward on every micro-batch's loss, and "
                                 "do not zero the gradients after the last one.")
        got = [p.grad.detach().clone() for p in model.parameters()]
        err = _rel_err(got, want)
        if err > GRAD_RTOL:
            for alt, hint in _accumulation_mistakes(start, batches, recipe, scale, want, sizes):
                if _rel_err(got, alt) <= GRAD_RTOL:
                    raise AssertionError(f"accumulate_gradients ({case}): {hint}")
            raise AssertionError(
                f"accumulate_gradients ({case}): the gradients differ from those of the whole "
                f"batch's mean loss by {err:.0%} of the largest entry. Each micro-batch: "
                "forward under autocast, loss * len(x) / N, scaler.scale(loss).backward().")
        got_loss = _as_loss(value, "accumulate_gradients", case)
        micro_sum = sum(_grads(start, a, b, recipe, 1.0, 1.0)[1] for a, b in batches)
        if len(sizes) > 1 and math.isclose(got_loss, micro_sum, rel_tol=AMP_RTOL / 3):
            raise AssertionError(
                f"accumulate_gradients ({case}) returned {got_loss:.4f}, the sum of the "
                f"micro-batches' mean losses; return the batch's mean loss ({want_loss:.4f}): "
                "the sum of the weighted losses, each detached.")
        _check_loss(got_loss, want_loss, fp32, "accumulate_gradients", case, scale, watch)
        _check_backward_outside_autocast(watch, "accumulate_gradients", case)
