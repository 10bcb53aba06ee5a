"""Lab 2, Part 5: the memorization test, a training loop's first check (check_memorize).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import (
    AMP_RTOL,
    BF16,
    BF16_SCALED,
    call_learner,
    one_thread,
    param_copies,
    tiny_problem,
)


@one_thread()
def check_memorize(memorize, steps: int = 100, lr: float = 1e-2, grad_scaler: bool = False,
                   seed: int = 0, threshold: float = 0.05) -> None:
    """memorize(model, x, y, recipe, steps, lr) trains on the one batch (x, y), in bf16 (with
    a GradScaler if `grad_scaler`), and returns each step's loss as a float. The checker then
    measures the model itself: its fp32 loss on the batch must be below `threshold` (the
    labels are random: only memorizing gets there)."""
    require_own_function(memorize, "memorize")
    recipe = BF16_SCALED if grad_scaler else BF16
    model, x, y = tiny_problem(seed, n=32, hidden=64, n_hidden=2)
    n = len(y)
    case = (f"{n} examples, steps={steps}, lr={lr}, bf16"
            f"{' with a GradScaler' if recipe.use_grad_scaler else ''}")
    with torch.no_grad():
        first = float(F.cross_entropy(model(x), y))
    before = param_copies(model)
    with torch.random.fork_rng(devices=[]):
        losses = call_learner(memorize, "memorize", model, x.clone(), y.clone(), recipe, steps,
                              lr, case=case)
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
    model.eval()
    with torch.no_grad():
        final = float(F.cross_entropy(model(x), y))
    if not final < threshold:
        raise AssertionError(f"memorize ({case}): afterwards the model's loss on its batch is "
                             f"{final:.3f} (it started at {first:.3f}); a working pipeline gets "
                             f"below {threshold}. The memorization test fails: "
                             + _why_not_learned(before, param_copies(model), losses, threshold))
    if not math.isclose(losses[0], first, rel_tol=AMP_RTOL):
        raise AssertionError(
            f"memorize ({case}): the first loss is {losses[0]:.4f}, but the batch's loss "
            f"before training is {first:.4f}: return the loss of every step, in order, on "
            "this batch, as amp_step returns it.")


def _why_not_learned(before, after, losses, threshold: float) -> str:
    """What the weights and the losses returned say about a model that did not memorize."""
    moved = max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True))
    if losses[-1] < threshold:
        return (f"yet the losses returned went down to {losses[-1]:.3f}, so another model "
                "learned: train the model passed in, not a copy.")
    if moved == 0:
        return ("the model's weights never moved (max |dw| = 0): the optimizer holds other "
                "parameters, or every step leaves the weights as they were.")
    return (f"the weights moved (max |dw| = {moved:.3g}) and the losses returned stayed near "
            f"{losses[-1]:.3f}, so the model learned something other than this batch: x and y "
            "no longer paired (inputs reordered without their labels), or a new batch each "
            "step.")
