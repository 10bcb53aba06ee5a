"""Checkers for Lab 2, from CPU to GPU training with AMP
(solutions/lab2_amp_training/lab2_amp_training.ipynb).

Each checker builds its own small model, batches, optimizer and GradScaler, runs the learner's
function on them, and compares what happened (parameters, gradients, the scale, the random
state) with a reference computed here. A known mistake is recognized by computing what it would
have produced, and the message says which line to look at.

    check_to_device(to_device)                         Part 1  batches on the device
    check_amp_step(amp_step)                           Part 2  autocast, GradScaler, clipping
    check_accumulate_gradients(accumulate_gradients)   Part 3  micro-batches add up to the batch
    check_resume(snapshot, restore)                    Part 4  a resumed run equals the original
    check_memorize(memorize)                           Part 5  the memorization test

Everything runs on the CPU, on either runner: placement is graded on the `meta` device (shapes
and no data; every PyTorch has it), precision in bf16. Where the GradScaler's logic is graded, a
scaler is switched on next to bf16: it does the same algebra on CPU tensors (scale, unscale,
skip the step on inf, grow and back off). fp16 never runs here: a CPU emulates it, ~100x slower.
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""

from __future__ import annotations

import copy
import io
import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gpulab.checks.common import defined_in_library
from gpulab.env import AutocastRecipe
from gpulab.models import MLP

BF16 = AutocastRecipe("cpu", "bfloat16", use_grad_scaler=False)  # the cpu runner's recipe
BF16_SCALED = AutocastRecipe("cpu", "bfloat16", use_grad_scaler=True)  # + a scaler, as fp16 has
SCALE = 2.0**10  # the checkers' GradScaler init_scale: a power of two, so scaling is exact
AMP_RTOL = 3e-2  # a bf16 loss lies within 3% of the fp32 one (8 significant bits)
GRAD_RTOL = 2e-2  # bf16 gradients summed in another order: within 2% of the largest entry
UPDATE_RTOL = 1e-2  # the same step computed twice: the updates agree to 1%
LR = 0.5  # plain SGD: the update is -LR * grad, so any wrong gradient shows in the weights
N_FEATURES, N_CLASSES = 12, 5

# ----------------------------------------------------------------------------- shared


@contextmanager
def _one_thread():
    """Run the body on one CPU thread. The checkers' models are tiny: one thread runs them
    fastest, and other processes competing for the cores (a grading machine runs several
    submissions at once) cannot slow it down tenfold. The learner's setting comes back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _require_own_function(fn, name: str) -> None:
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise AssertionError(f"{name} is not a function (it is a {type(fn).__name__}). Define "
                             f"it with `def {name}(...)` and run that cell again.")
    if defined_in_library(fn):
        raise AssertionError(f"{name} is gpulab's {fn.__module__}.{fn.__name__}: write your "
                             "own in the notebook; importing gpulab's version earns no points.")


_HINTS = (  # (text in the error, what to look at)
    ("No inf checks were recorded", "scaler.update() found no gradients checked for inf: it "
     "comes after scaler.step(optimizer), and the gradients must still be in .grad at the step "
     "(no zero_grad between backward and the step)."),
    ("unscale_() has already been called", "Call scaler.unscale_(optimizer) once per step, "
     "before clipping; scaler.step does not unscale a second time."),
    ("_scale is None", "Run backward on scaler.scale(loss), not on the loss: the scaler sets "
     "up its scale there, and unscale_ and step divide by it."),
    ("does not require grad", "backward needs the loss as computed from the model's output: "
     "do not detach it (or compute it under torch.no_grad()) before backward."),
    ("same device", "Every tensor of a step must be on the model's device: move the model with "
     ".to(device) and each batch with to_device."),
)


def _hint_for(error: Exception) -> str:
    if isinstance(error, NotImplementedError):
        return "Replace `raise NotImplementedError()` with your code."
    for text, hint in _HINTS:
        if text in str(error):
            return hint
    return "The traceback above shows the line that failed."


def _call(fn, name: str, *args, case: str = ""):
    """fn(*args); an error becomes an AssertionError that says which call failed and why."""
    try:
        return fn(*args)
    except Exception as error:  # the learner's code may raise anything; say what it means
        first = (str(error).strip().splitlines() or [""])[0][:300]
        said = f"{type(error).__name__}: {first}" if first else type(error).__name__
        raise AssertionError(f"{name} ({case}) raised {said}\n{_hint_for(error)}") from error


class _Watch(TorchFunctionMode):
    """While active, records each tensor copy (.to / .cuda) and whether it was asynchronous,
    and whether autocast was on at each Linear layer and at each backward()."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.copies: list[bool] = []  # non_blocking of each copy
        self.linear_in_autocast: list[bool] = []
        self.backward_in_autocast: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda"):
            self.copies.append(kwargs.get("non_blocking") is True
                               or any(a is True for a in args[2:]))
        elif name in ("linear", "backward"):
            on = torch.is_autocast_enabled(self.device_type)
            (self.linear_in_autocast if name == "linear" else self.backward_in_autocast).append(on)
        return func(*args, **kwargs)


def _problem(seed: int, n: int, hidden: int = 32, n_hidden: int = 1, dropout: float = 0.0):
    """A small classifier and n examples for it, made from `seed` without touching torch's
    global random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(N_FEATURES, N_CLASSES, hidden=hidden, n_hidden=n_hidden, dropout=dropout)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, N_FEATURES, generator=g)  # (n, F)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)  # (n,)
    return model, x, y


def _scaler(enabled: bool, growth_interval: int = 1):
    return torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=growth_interval,
                                enabled=enabled)


def _scaler_name(enabled: bool) -> str:
    return f"GradScaler(init_scale={SCALE:g})" if enabled else "no GradScaler"


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _fill_stale(model, value: float) -> None:
    """Leave gradients in .grad, as the previous step does."""
    for p in model.parameters():
        p.grad = torch.full_like(p, value)


def _rel_err(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Largest |got - want| over the largest |want| (inf where got holds NaN)."""
    top = max(float(w.abs().max()) for w in want)
    diffs = [float((g.double() - w.double()).abs().max()) for g, w in zip(got, want, strict=True)]
    if any(math.isnan(d) for d in diffs):
        return math.inf
    return max(diffs) / top if top > 0 else (0.0 if max(diffs) == 0 else math.inf)


def _as_loss(value, name: str, case: str) -> float:
    """The loss a step returned, which must be a detached one-element tensor, as a float."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise AssertionError(
            f"{name} ({case}) returned the number {value!r}: return the loss as a tensor, "
            "loss.detach(). Making it a Python number (.item(), float()) makes the host wait "
            "for the GPU to finish, every step; convert many losses at once when you log.")
    if not isinstance(value, torch.Tensor):
        raise AssertionError(f"{name} ({case}) returned {type(value).__name__}; return the loss "
                             "as a tensor: loss.detach().")
    if value.requires_grad:
        raise AssertionError(
            f"{name} ({case}) returned a loss still attached to the autograd graph: return "
            "loss.detach(), or the graph (and every activation it holds) stays alive as long "
            "as the loss does.")
    if value.numel() != 1:
        raise AssertionError(f"{name} ({case}) returned a tensor of shape "
                             f"{tuple(value.shape)}; the loss is one number, the batch's mean.")
    return float(value.detach().reshape(()).float().cpu())


def _check_loss(got: float, want: float, fp32: float, name: str, case: str, scale: float,
                watch: _Watch) -> None:
    times = math.log2(got / want) if scale != 1 and got > 1.5 * want > 0 else 0.5
    if abs(times - round(times)) < 1e-3:  # a power of two: the loss times the scale
        raise AssertionError(f"{name} ({case}) returned {got:.4f}, the loss times the scale "
                             f"({2**round(times):g}): return the loss itself, not "
                             "scaler.scale(loss).")
    if watch.linear_in_autocast and not all(watch.linear_in_autocast):
        raise AssertionError(
            f"{name} ({case}): the model's forward pass ran outside autocast. Compute "
            "model(x) and the loss inside `with torch.autocast(recipe.device_type, "
            "dtype=recipe.dtype):`, with the recipe passed in (never a hard-coded device).")
    if not math.isclose(got, fp32, rel_tol=AMP_RTOL):
        raise AssertionError(
            f"{name} ({case}) returned a loss of {got:.5f}; the cross-entropy of the model on "
            f"this batch is {want:.5f} under bf16 autocast ({fp32:.5f} in fp32). Return the "
            "mean cross-entropy F.cross_entropy(model(x), y), computed before the step.")


def _check_backward_outside_autocast(watch: _Watch, name: str, case: str) -> None:
    if any(watch.backward_in_autocast):
        raise AssertionError(
            f"{name} ({case}): backward ran inside torch.autocast. End the `with` block after "
            "the loss: autocast is for the forward pass, and backward already runs each op in "
            "the dtype its forward used.")


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


# ----------------------------------------------------------------------------- Part 4

RESUME_BATCH = 8  # examples per step, drawn with torch's generator (as a shuffle would)


def _resume_setup(seed: int):
    """Training with every kind of state a resume must restore: dropout and the data order
    (torch's RNG), AdamW's moments, a GradScaler whose scale has moved."""
    model, x, y = _problem(seed, n=48, dropout=0.25)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, _scaler(True, growth_interval=2), (x, y)


def _resume_step(model, optimizer, scaler, data) -> torch.Tensor:
    x, y = data
    idx = torch.randint(0, len(y), (RESUME_BATCH,))
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[idx]), y[idx])  # fp32: the run is compared bit for bit
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def _capture(model, optimizer, scaler) -> dict:
    return {"params": _params(model), "optimizer": copy.deepcopy(optimizer.state_dict()["state"]),
            "scaler": scaler.state_dict(), "rng": torch.get_rng_state()}


def _same(a, b) -> bool:
    """Equal, bit for bit, through nested dicts, lists and tuples of tensors and numbers."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b, strict=True))
    return a == b


def _round_trip(snap, case: str):
    """The snapshot as a new process reads it: torch.save, then torch.load(weights_only)."""
    buffer = io.BytesIO()
    try:
        torch.save(snap, buffer)
    except Exception as error:
        raise AssertionError(f"snapshot ({case}): torch.save could not write what snapshot "
                             f"returned ({type(error).__name__}: {error}).") from error
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True)
    except Exception as error:
        lines = str(error).splitlines()
        why = next((s.strip() for s in lines if "Unsupported global" in s), lines[0] if lines
                   else "")[:160]
        raise AssertionError(
            f"snapshot ({case}): torch.load(..., weights_only=True) refused it ({why}). Keep "
            "only tensors, numbers, strings, lists and dicts in it (state_dict()s, "
            "torch.get_rng_state()): anything else needs pickle, which can run code hidden in "
            "a file.") from error


def _check_restored(got: dict, want: dict, later: dict, fresh: dict, case: str) -> None:
    where = f"restore ({case})"
    if not _same(got["params"], want["params"]):
        if _same(got["params"], later["params"]):
            raise AssertionError(
                f"{where}: the weights are those from the end of the run, not from the "
                "snapshot: model.state_dict() holds the live parameters, which training went "
                "on changing. Store copies: copy.deepcopy(model.state_dict()).")
        hint = ("the model kept its own fresh weights: load the snapshot's with "
                "model.load_state_dict(...)." if _same(got["params"], fresh["params"]) else
                "they differ from the model's at the snapshot.")
        raise AssertionError(f"{where}: the weights were not restored: {hint}")
    if not _same(got["optimizer"], want["optimizer"]):
        if _same(got["optimizer"], later["optimizer"]):
            raise AssertionError(
                f"{where}: the optimizer state is the one from the end of the run: "
                "optimizer.state_dict() refers to the tensors each step updates in place. "
                "Store a copy: copy.deepcopy(optimizer.state_dict()).")
        raise AssertionError(
            f"{where}: the optimizer's state was not restored. AdamW keeps, for every "
            "parameter, two running averages (exp_avg, exp_avg_sq) and a step count, and the "
            "next steps depend on them: store optimizer.state_dict() in the snapshot and load "
            "it with optimizer.load_state_dict().")
    got_s, want_s = got["scaler"], want["scaler"]
    if (got_s.get("scale"), got_s.get("_growth_tracker")) != (want_s["scale"],
                                                               want_s["_growth_tracker"]):
        raise AssertionError(
            f"{where}: the GradScaler was not restored: scale {got_s.get('scale')}, growth "
            f"tracker {got_s.get('_growth_tracker')}; at the snapshot they were "
            f"{want_s['scale']} and {want_s['_growth_tracker']}. Store scaler.state_dict() "
            "and load it with scaler.load_state_dict(); otherwise a resumed fp16 run restarts "
            "its scale and loses steps finding it again.")
    if not torch.equal(got["rng"], want["rng"]):
        raise AssertionError(
            f"{where}: torch's random state was not restored. Dropout masks and the order of "
            "the batches come from it, so the resumed run would draw other ones: store "
            "torch.get_rng_state() and put it back with torch.set_rng_state() (on a CUDA GPU, "
            "torch.cuda.get_rng_state_all() too).")


@_one_thread()
def check_resume(snapshot, restore, steps_before: int = 3, steps_after: int = 3,
                 seed: int = 0) -> None:
    """snapshot(model, optimizer, scaler, step) -> a copy of everything the next step depends
    on; restore(snap, model, optimizer, scaler) -> step puts it into fresh objects. After a
    round trip through torch.save and torch.load(weights_only=True), the resumed run must
    repeat the uninterrupted one bit for bit: same losses, same weights."""
    _require_own_function(snapshot, "snapshot")
    _require_own_function(restore, "restore")
    case = f"snapshot after {steps_before} steps, then {steps_after} more"
    with torch.random.fork_rng(devices=[]):  # the notebook's own random state is left alone
        torch.manual_seed(seed)
        model, optimizer, scaler, data = _resume_setup(seed)
        for _ in range(steps_before):
            _resume_step(model, optimizer, scaler, data)
        want = _capture(model, optimizer, scaler)
        snap = _call(snapshot, "snapshot", model, optimizer, scaler, steps_before, case=case)
        want_losses = [_resume_step(model, optimizer, scaler, data) for _ in range(steps_after)]
        later = _capture(model, optimizer, scaler)
        loaded = _round_trip(snap, case)

        model2, optimizer2, scaler2, _ = _resume_setup(seed + 1)  # a new process: other weights
        fresh = _capture(model2, optimizer2, scaler2)
        torch.manual_seed(seed + 1000)  # ...and its own random state
        step = _call(restore, "restore", loaded, model2, optimizer2, scaler2, case=case)
        if isinstance(step, bool) or not isinstance(step, int) or step != steps_before:
            raise AssertionError(
                f"restore ({case}) returned {step!r}, expected {steps_before}, the step given "
                "to snapshot: a resumed run counts on from there (schedules and logs use it).")
        _check_restored(_capture(model2, optimizer2, scaler2), want, later, fresh, case)
        for i, want_loss in enumerate(want_losses):
            got_loss = _resume_step(model2, optimizer2, scaler2, data)
            if not torch.equal(got_loss, want_loss):
                raise AssertionError(
                    f"restore ({case}): step {steps_before + i} of the resumed run had loss "
                    f"{float(got_loss):.6f}, the uninterrupted run {float(want_loss):.6f}; they "
                    "must agree bit for bit. Something else that decides a step was not saved "
                    "or not restored.")
        if not _same(_params(model2), _params(model)):
            raise AssertionError(f"restore ({case}): the resumed run ended with other weights "
                                 "than the uninterrupted one.")


# ----------------------------------------------------------------------------- Part 5


@_one_thread()
def check_memorize(memorize, steps: int = 100, lr: float = 1e-2, grad_scaler: bool = False,
                   seed: int = 0, threshold: float = 0.05) -> None:
    """memorize(model, x, y, recipe, steps, lr) trains on the one batch (x, y), in bf16 (with
    a GradScaler if `grad_scaler`), and returns each step's loss as a float. The checker then
    measures the model itself: its fp32 loss on the batch must be below `threshold` (the
    labels are random: only memorizing gets there)."""
    _require_own_function(memorize, "memorize")
    recipe = BF16_SCALED if grad_scaler else BF16
    model, x, y = _problem(seed, n=32, hidden=64, n_hidden=2)
    n = len(y)
    case = (f"{n} examples, steps={steps}, lr={lr}, bf16"
            f"{' with a GradScaler' if recipe.use_grad_scaler else ''}")
    with torch.no_grad():
        first = float(F.cross_entropy(model(x), y))
    with torch.random.fork_rng(devices=[]):
        losses = _call(memorize, "memorize", model, x.clone(), y.clone(), recipe, steps, lr,
                       case=case)
    if not isinstance(losses, list | tuple) or len(losses) != steps:
        got = f"a {type(losses).__name__}" + (f" of {len(losses)}" if isinstance(
            losses, list | tuple) else "")
        raise AssertionError(f"memorize ({case}) returned {got}; expected a list of {steps} "
                             "losses, one per step.")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in losses):
        kind = type(next(v for v in losses if not isinstance(v, int | float))).__name__
        raise AssertionError(
            f"memorize ({case}) returned a list of {kind}; return Python floats: collect the "
            "steps' loss tensors and convert them once at the end "
            "(torch.stack(losses).tolist()), one wait for the device instead of one per step.")
    if not math.isclose(losses[0], first, rel_tol=AMP_RTOL):
        raise AssertionError(
            f"memorize ({case}): the first loss is {losses[0]:.4f}, but the batch's loss "
            f"before training is {first:.4f}: return the loss of every step, in order, on "
            "this batch, as amp_step returns it.")
    model.eval()
    with torch.no_grad():
        final = float(F.cross_entropy(model(x), y))
    if not final < threshold:
        copied = (" The losses returned did go down, so another model learned: train the "
                  "model passed in, not a copy." if losses[-1] < threshold else "")
        raise AssertionError(
            f"memorize ({case}): afterwards the model's loss on its batch is {final:.3f} (it "
            f"started at {first:.3f}); a working pipeline gets below {threshold}. The "
            "memorization test fails, so something keeps the model from learning even one "
            "batch: x and y no longer paired (a shuffle applied to one of them), a new batch "
            "each step, an optimizer over other parameters, or a step that leaves the weights "
            f"as they were.{copied}")
