"""Lab 4, Part A2: fit the step under the memory budget with the same result (check_fit_step).
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import GRAD_RTOL, UPDATE_RTOL, hint_for, one_thread
from gpulab.memory import explain_oom, format_bytes, free_memory, memory_budget
from gpulab.memory.oom_scenario import BATCH_SIZE, oom_scenario
from gpulab.stubs import is_stub_error, not_started

LOSS_RTOL = 2e-3  # bf16 autocast moves this loss by ~1e-5: anything past 0.2% is another loss
FIXES = ("smaller micro-batches, more of them: accumulate the gradients (the model states stay, "
         "the activations shrink with the micro-batch; costs time, not memory)",
         "bf16 autocast around the forward pass and the loss: most activations in 2 bytes "
         "(alone, often not enough)",
         "activation checkpointing of the Blocks: gpulab.memory.checkpoint_blocks(model) keeps "
         "one input per Block (costs one more forward)")


def _loss_value(value, case: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise AssertionError(
                f"fit_step ({case}) returned a loss still attached to the autograd graph: return "
                "it detached (loss.detach(), or a sum of detached losses). An attached loss keeps "
                "the graph, and every activation in it, alive for as long as you hold it.")
        if value.numel() != 1:
            raise AssertionError(f"fit_step ({case}) returned a tensor of shape "
                                 f"{tuple(value.shape)}; return one number, the batch's mean loss.")
        return float(value.detach().reshape(()).float().cpu())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise AssertionError(f"fit_step ({case}) returned {value!r}; return the loss of the whole "
                         "batch (a float or a one-element tensor, detached).")


def _run_budgeted(fit_step, scenario, model, optimizer, x, y, case: str):
    """fit_step under the scenario's budget; an OOM becomes an AssertionError saying what was
    live and what to try, cheapest first."""
    report = None
    try:
        with memory_budget(scenario.budget_bytes, model=model, optimizer=optimizer,
                           tensors=(x, y)) as budget:
            value = fit_step(model, optimizer, x, y)
    except torch.OutOfMemoryError as error:
        report = explain_oom(error)
        error.__traceback__ = None  # let the failed step's tensors go
        del error
        free_memory()
    except Exception as error:  # the learner's code may raise anything; say what it means
        if is_stub_error(error):
            raise AssertionError(not_started("fit_step")) from error
        first = (str(error).strip().splitlines() or [""])[0][:300]
        raise AssertionError(f"fit_step ({case}) raised {type(error).__name__}: {first}\n"
                             f"{hint_for(error)}") from error
    if report is None:
        # The budget object lives in the learner's process: read the peak, not only its verdict.
        if budget.peak_bytes > scenario.budget_bytes:
            raise AssertionError(
                f"fit_step ({case}) held {format_bytes(budget.peak_bytes)} at its peak, over the "
                f"{format_bytes(scenario.budget_bytes)} budget, yet no out-of-memory error "
                "reached the checker: the budget must stay as the checker set it.")
        return value
    tips = "\n".join(f"  {i}. {tip}" for i, tip in enumerate(FIXES, 1))
    raise AssertionError(
        f"fit_step ({case}) ran out of memory: during {report.phase}, in {report.op}, it tried to "
        f"allocate {format_bytes(report.tried_bytes)} with {format_bytes(report.live.total)} of "
        f"the {format_bytes(scenario.budget_bytes)} budget live:\n{report.live.table()}\n"
        f"The largest is {report.dominant}. What to try, cheapest first:\n{tips}")


def _per_example_grads(start_model, x, y) -> torch.Tensor:
    """(n_params, B): column i is the gradient of example i's mean loss, in float64."""
    model = copy.deepcopy(start_model)
    columns = []
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i:i + 1]).flatten(0, 1), y[i].flatten()).backward()
        columns.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    return torch.stack(columns, dim=1)


def _runs(weights: list[float]) -> list[tuple[int, int, float]]:
    """Consecutive examples with (nearly) the same weight: (first, last, mean weight)."""
    top = max(abs(w) for w in weights) or 1.0
    runs = []
    for i, w in enumerate(weights):
        if runs and abs(w - runs[-1][2]) <= 0.03 * top:
            first, _, mean = runs[-1]
            runs[-1] = (first, i, mean + (w - mean) / (i - first + 1))
        else:
            runs.append((i, i, w))
    return runs


def _as_fraction(w: float) -> str:
    if abs(w) < 1e-3:
        return "0"
    inverse = round(1 / w)
    return f"1/{inverse}" if inverse and abs(1 / inverse - w) <= 0.02 * abs(w) else f"{w:.4f}"


def _weights_hint(start_model, x, y, got) -> str:
    """What the learner's gradient is, as a weighted sum of the per-example gradients."""
    n = len(x)
    columns = _per_example_grads(start_model, x, y)
    target = torch.cat([g.flatten() for g in got]).double()
    weights = torch.linalg.lstsq(columns, target.unsqueeze(1)).solution.flatten()
    residual = float((columns @ weights - target).norm() / target.norm())
    if residual > 0.1:  # not a weighting of these examples' gradients
        return ("Each micro-batch: its mean loss times len(x_i) / N, then backward; step once "
                "after the last one.")
    runs = _runs(weights.tolist())
    said = ", ".join(f"example{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}: "
                     f"{_as_fraction(w)}" for a, b, w in runs)
    seen = f"Your gradient counts {said}; the whole batch's mean loss counts each example 1/{n}. "
    if any(abs(w) < 0.1 / n for *_, w in runs):
        if abs(runs[-1][2]) >= 0.1 / n and all(abs(w) < 0.1 / n for *_, w in runs[:-1]):
            return seen + ("Only the last micro-batch is left: the gradients were zeroed inside "
                           "the loop. Zero them once, at the start of the step: backward adds "
                           "into .grad, which is what accumulation relies on.")
        return seen + ("Some examples are missing: the step must use all of x and y, the same "
                       "effective batch as the plain step, split into micro-batches.")
    if len(runs) == 1:
        return seen + (f"That is {runs[0][2] * n:.2g} times the batch's gradient: multiply each "
                       "micro-batch's mean loss by its share of the batch, len(x_i) / N, before "
                       "backward.")
    if abs(sum(w * (b - a + 1) for a, b, w in runs) - 1) <= 0.03:  # the weights add up to 1
        return seen + ("The examples of small micro-batches count more: each micro-batch's mean "
                       "loss was divided by k, which is right only when they are all the same "
                       "size (N need not be a multiple of k). Multiply each one's mean loss by "
                       "len(x_i) / N instead.")
    return seen + "Multiply each micro-batch's mean loss by len(x_i) / N, so every example " \
                  "counts 1/N."


def _check_gradients(got, want, stale, start_model, x, y, case: str) -> None:
    err = rel_err(got, want)
    if err <= GRAD_RTOL:
        return
    if rel_err(got, [w + s for w, s in zip(want, stale, strict=True)]) <= GRAD_RTOL:
        raise AssertionError(
            f"fit_step ({case}): the gradients include the previous step's, which were still in "
            ".grad: start with optimizer.zero_grad(set_to_none=True), before the first backward.")
    raise AssertionError(
        f"fit_step ({case}): the gradients left in .grad differ from the plain step's by "
        f"{err:.0%} of the largest entry. {_weights_hint(start_model, x, y, got)}")


def _check_steps(model, optimizer, start_model, case: str) -> None:
    """AdamW counts its steps: 1 after the warm-up, so 2 after one more."""
    params = list(model.parameters())
    steps = optimizer.state.get(params[0], {}).get("step")
    moved = any(not torch.equal(p, b) for p, b in
                zip(params, start_model.parameters(), strict=True))
    if steps is None or int(steps) == 1:
        raise AssertionError(
            f"fit_step ({case}): the optimizer passed in did not step"
            + (" (yet the parameters moved: use that optimizer, whose AdamW state carries over "
               "from step to step, not one of your own)." if moved else
               ": call optimizer.step() once, after the last micro-batch's backward."))
    if int(steps) > 2:
        raise AssertionError(
            f"fit_step ({case}): optimizer.step() ran {int(steps) - 1} times in one call. Step "
            "once, after the last micro-batch: one optimizer step on the whole batch.")


def _check_update(model, start, got, case: str) -> None:
    """The parameters moved as one AdamW step with the gradients left in .grad moves them."""
    params = list(model.parameters())
    before = [p.detach().clone() for p in start[0].parameters()]
    replay_model, replay_optimizer = copy.deepcopy(start)
    for p, g in zip(replay_model.parameters(), got, strict=True):
        p.grad = g.clone()
    replay_optimizer.step()
    want = [p.detach() - b for p, b in zip(replay_model.parameters(), before, strict=True)]
    err = rel_err([p.detach() - b for p, b in zip(params, before, strict=True)], want)
    if err > UPDATE_RTOL:
        raise AssertionError(
            f"fit_step ({case}): the parameters moved differently from one AdamW step with the "
            f"gradients left in .grad (off by {err:.0%} of the largest change). Leave the "
            "gradients as optimizer.step() used them, and change the parameters only through "
            "the optimizer.")


@one_thread()
def check_fit_step(fit_step, batch_size: int = BATCH_SIZE, seed: int = 0) -> None:
    """fit_step(model, optimizer, x, y) takes one AdamW step on the whole batch within the
    scenario's budget, and matches the plain step run without one: loss, gradients, update."""
    require_own_function(fit_step, "fit_step")
    scenario = oom_scenario(batch_size, seed)
    case = f"B={batch_size}, seed={seed}, budget {format_bytes(scenario.budget_bytes)}"
    model, optimizer, x, y = scenario.make()
    scenario.plain_step(model, optimizer, x, y)  # AdamW's state exists; .grad holds this step's
    start = copy.deepcopy((model, optimizer))
    stale = [p.grad.clone() for p in model.parameters()]
    want_loss = float(scenario.plain_step(model, optimizer, x, y))
    want = [p.grad.clone() for p in model.parameters()]

    model, optimizer = copy.deepcopy(start)
    for p, g in zip(model.parameters(), stale, strict=True):
        p.grad = g.clone()  # deepcopy leaves .grad behind; the previous step did not
    value = _run_budgeted(fit_step, scenario, model, optimizer, x.clone(), y.clone(), case)
    got_loss = _loss_value(value, case)
    named = list(model.named_parameters())
    missing = [name for name, p in named if p.grad is None or not p.grad.any()]
    if len(missing) == len(named):
        raise AssertionError(
            f"fit_step ({case}): no gradients were left in .grad after the step. Zero them at "
            "the start of the step, before the first backward, not after optimizer.step().")
    if missing:
        raise AssertionError(f"fit_step ({case}): {missing[0]} has no gradient after the step: "
                             "every parameter gets one from backward through the whole model.")
    _check_steps(model, optimizer, start[0], case)
    got = [p.grad.detach().clone() for _, p in named]
    _check_gradients(got, want, stale, start[0], x, y, case)
    _check_update(model, start, got, case)
    if not math.isclose(got_loss, want_loss, rel_tol=LOSS_RTOL):
        ratio = got_loss / want_loss
        hint = (f"about {round(ratio)} times the mean: the micro-batches' losses were added "
                "without weighting." if ratio > 1.5 else
                "return the whole batch's mean: the sum of each micro-batch's mean loss times "
                "len(x_i) / N, each detached.")
        raise AssertionError(f"fit_step ({case}) returned a loss of {got_loss:.5f}; the batch's "
                             f"mean cross-entropy before the step is {want_loss:.5f}: {hint}")
