"""Lab 4, Part A1: read the OOM's peak and name what dominates it (check_diagnosis).

The expected numbers come from `expected_diagnosis`, which the grader runs outside the learner's
kernel (gpulab/checks/keys.py): a notebook that edits the scenario or the memory tracker in
place changes what its own kernel measures, not what its answers are compared with. The
hints still read the kernel's own measurement, which is what the learner saw.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import math

import torch

from gpulab.checks.harness.numbers import as_number
from gpulab.checks.harness.training import one_thread
from gpulab.memory import CATEGORIES
from gpulab.memory.measure import measure_step
from gpulab.memory.oom_scenario import oom_scenario

SHARE_ATOL = 0.03  # DOMINANT_SHARE: a share of the peak, read off a table to two digits
TIMES_RTOL = 0.05  # TIMES_MODEL_STATES: a ratio



def _plain_peak():
    scenario = oom_scenario()
    model, optimizer, x, y = scenario.make()
    return scenario, measure_step(model, (x, y), optimizer).breakdown  # fp32, after a warm-up


@one_thread()
def expected_diagnosis() -> dict:
    """The plain step's peak by category, in bytes, and the three answers, as plain values."""
    _, peak = _plain_peak()
    sizes = peak.as_dict()
    dominant = peak.dominant()
    states = peak.parameters + peak.gradients + peak.optimizer
    return {"sizes": {k: int(v) for k, v in sizes.items()}, "total": int(peak.total),
            "category": dominant, "share": sizes[dominant] / peak.total,
            "times_model_states": sizes[dominant] / states}


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _number(value, name: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:  # computed with torch: fine
        value = value.item()
    return as_number(value, name)


def require_answered(names: str, answers) -> None:
    """Fail as "not started" when every answer is still the release's placeholder, None (the
    answer cell raised NotImplementedError before it set them)."""
    if all(answer is None for answer in answers):
        raise AssertionError(
            f"{names} are still None: the answer cell raised NotImplementedError before "
            "computing them. Replace `raise NotImplementedError()` with your code.")


@one_thread()
def check_diagnosis(dominant_category, dominant_share, times_model_states,
                    want: dict | None = None) -> None:
    """The category holding the most bytes at the plain step's peak, its share of the peak, and
    how many times the model states (parameters + gradients + optimizer, at the peak) it is,
    against `want` (expected_diagnosis: the grader's answer key; computed here when None)."""
    require_answered("DOMINANT_CATEGORY, DOMINANT_SHARE and TIMES_MODEL_STATES",
                     (dominant_category, dominant_share, times_model_states))
    want = expected_diagnosis() if want is None else want
    scenario, peak = _plain_peak()
    sizes = want["sizes"]
    dominant = want["category"]
    table = "\n" + peak.table("the plain step's peak (measure_step):")
    if dominant_category not in CATEGORIES:
        raise AssertionError(f"DOMINANT_CATEGORY is {dominant_category!r}; it should be one of "
                             f"{CATEGORIES}, the names of gpulab.memory.CATEGORIES.")
    if dominant_category != dominant:
        raise AssertionError(
            f"DOMINANT_CATEGORY = {dominant_category!r}: at the peak it held "
            f"{_mib(sizes[dominant_category])} "
            f"({sizes[dominant_category] / want['total']:.1%} of the peak), while {dominant!r} "
            f"held {_mib(sizes[dominant])}. Measure the plain step with "
            "measure_step (without a budget) and take the largest row of its breakdown." + table)
    share = _number(dominant_share, "DOMINANT_SHARE")
    if abs(share - want["share"]) > SHARE_ATOL:
        raise AssertionError(f"DOMINANT_SHARE = {share:g}, expected {want['share']:.3f} = "
                             f"{_mib(sizes[dominant])} / {_mib(want['total'])}: "
                             + _share_hint(share, want["share"], sizes[dominant], scenario)
                             + table)
    times = _number(times_model_states, "TIMES_MODEL_STATES")
    ratio = want["times_model_states"]
    if not math.isclose(times, ratio, rel_tol=TIMES_RTOL):
        full = scenario.estimate().model_states().total_bytes  # 16 bytes per parameter
        if times > 0 and math.isclose(1 / times, ratio, rel_tol=TIMES_RTOL):
            hint = "that is the inverse: the dominant category's bytes over the model states'."
        elif math.isclose(times, sizes[dominant] / full, rel_tol=TIMES_RTOL):
            hint = (f"you counted all the gradients ({_mib(peak.parameters)}); at the peak only "
                    f"{_mib(peak.gradients)} of them exist (backward has just begun). Use the "
                    "three rows as the breakdown at the peak shows them.")
        elif math.isclose(times, _times_under_autocast(scenario), rel_tol=TIMES_RTOL):
            hint = ("that is the ratio under autocast; measure the plain step as it is, in fp32: "
                    "measure_step(model, (x, y), optimizer), with no amp.")
        else:
            hint = "divide the dominant row by the sum of the parameters, gradients and " \
                   "optimizer rows."
        raise AssertionError(
            f"TIMES_MODEL_STATES = {times:g}, expected {ratio:.2f} = {_mib(sizes[dominant])} / "
            f"({_mib(sizes['parameters'])} + {_mib(sizes['gradients'])} + "
            f"{_mib(sizes['optimizer'])}): "
            + hint + table)


def _share_hint(share: float, want: float, dominant_bytes: int, scenario) -> str:
    if 1 < share <= 100 and abs(share / 100 - want) <= SHARE_ATOL:
        return "a share is a fraction between 0 and 1, not a percentage (0.72, not 72)."
    if abs(share - dominant_bytes / scenario.budget_bytes) <= SHARE_ATOL:
        return (f"that is its size over the budget ({_mib(scenario.budget_bytes)}); the share is "
                "over the step's peak, measured without a budget.")
    run = scenario.run(scenario.plain_step, steps=1)
    if run.report is not None and abs(share - _top_share(run.report.live)) <= SHARE_ATOL:
        return ("that is the share in the OOM report, which says what was live when the budget "
                "ran out, part-way through forward. The peak of the whole step comes later: "
                "measure it with measure_step, without a budget.")
    return "divide the dominant category's bytes at the peak by the total at the peak."


def _times_under_autocast(scenario) -> float:
    model, optimizer, x, y = scenario.make()
    peak = measure_step(model, (x, y), optimizer, amp=True).breakdown
    return max(peak.as_dict().values()) / (peak.parameters + peak.gradients + peak.optimizer)


def _top_share(breakdown) -> float:
    return max(breakdown.as_dict().values()) / max(breakdown.total, 1)


