"""Lab 4, Part B1: read slow_train's profile (check_profile_reading).

The learner profiles one step of slow_train at a time (profile_steps for the phases,
count_transfers for the host-device traffic) and answers from what they read: the largest phase,
its share of the step, the syncs per step and the bytes copied to the device per step. The
expected answers come from `expected_profile`, which the grader runs outside the learner's kernel
(gpulab/checks/keys.py). The counts are exact on either runner. The share is a timing, and a busy
machine moves it (on 2 loaded cores, 0.52 to 0.69 for the same step), so the grader profiles the
step PROFILE_RUNS times and accepts a share within SHARE_ATOL of any of them. A share outside
that is measured again in the test cell itself, under the load the learner's own profile ran
in, and accepted within SHARE_ATOL of those runs: a timing, unlike the counts, can only be
checked against the machine it ran on (the integrity guard watches the profiler and the clocks
there, as it does for the speed-up). A phase within SHARE_ATOL of the largest counts as the
largest.
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import math

from gpulab.checks.harness.numbers import as_number
from gpulab.checks.harness.training import one_thread
from gpulab.checks.lab4.diagnosis import require_answered
from gpulab.profiling import profile_steps
from gpulab.profiling.transfers import count_transfers
from gpulab.slow_pipeline import MICRO_BATCH_SIZE, pipeline_problem, slow_train

SHARE_ATOL = 0.10  # around the grader's own spread: a reading, not a measurement, is graded
COUNT_RTOL = 0.01  # syncs and bytes are counted, not timed: exact up to how they are written
PROFILED_STEPS, COUNTED_STEPS = 3, 2
PROFILE_RUNS = 3  # the learner profiled at another time, under another load


def slow_step(problem):
    """(one step of slow_train on a fresh model, each call on the next batch; the model)."""
    model = problem.new_model()
    optimizer = problem.new_optimizer(model)
    seeds = iter(range(1_000_000))

    def one_slow_step():
        slow_train(model, optimizer, problem.images, problem.labels, steps=1,
                   batch_size=problem.batch_size, seed=next(seeds))

    return one_slow_step, model


def measured_shares(problem=None) -> tuple[dict, dict]:
    """slow_train's phases' shares of a step, from the middle one of PROFILE_RUNS profiles, and
    each phase's [lowest, highest] share over all of them."""
    step, _ = slow_step(pipeline_problem() if problem is None else problem)
    runs = [profile_steps(step, steps=PROFILED_STEPS, warmup=1).phases().shares()
            for _ in range(PROFILE_RUNS)]
    ranges = {k: [min(float(r[k]) for r in runs), max(float(r[k]) for r in runs)]
              for k in runs[0]}
    largest = max(runs[0], key=runs[0].get)
    middle = sorted(runs, key=lambda run: run[largest])[len(runs) // 2]
    return {k: float(v) for k, v in middle.items()}, ranges


@one_thread()
def expected_profile() -> dict:
    """slow_train's phases' shares of a step (measured_shares), its largest phase, and its
    syncs, copies to the device and their bytes per step, as plain values."""
    problem = pipeline_problem()
    shares, ranges = measured_shares(problem)
    step, model = slow_step(problem)
    counts = count_transfers(step, model, steps=COUNTED_STEPS)
    return {"shares": shares, "share_ranges": ranges,
            "phase": max(shares, key=shares.get), "syncs": counts.syncs,
            "h2d_copies": counts.h2d_copies, "h2d_bytes": counts.h2d_bytes,
            "micro_batches": problem.batch_size // MICRO_BATCH_SIZE}


def _count_hint(got: float, want: dict, key: str, what: str) -> str:
    per_step, micro = want[key], want["micro_batches"]
    if math.isclose(got, per_step / micro, rel_tol=COUNT_RTOL):
        return (f"that is per micro-batch; a step runs {micro} micro-batches. Answer per step, "
                "as the counts are printed.")
    for steps in (PROFILED_STEPS, COUNTED_STEPS, 5):
        if math.isclose(got, per_step * steps, rel_tol=COUNT_RTOL):
            return f"that is the total over {steps} steps; answer per step (the mean)."
    if key == "h2d_bytes" and any(math.isclose(got * k, per_step, rel_tol=COUNT_RTOL)
                                  for k in (1000, 1024)):
        return "that is in kilobytes; answer in bytes."
    return (f"read the {what} row of count_transfers(...) for slow_train's step, as printed "
            "above, and take it from the result's attributes rather than copying it.")


@one_thread()
def check_profile_reading(dominant_phase, phase_share, syncs_per_step, h2d_bytes_per_step,
                          want: dict | None = None) -> None:
    """The largest phase of slow_train's step, its share of the step (a fraction), its
    host-device syncs per step and its bytes copied host-to-device per step, against `want`
    (expected_profile: the grader's answer key; computed here when None)."""
    require_answered("DOMINANT_PHASE, PHASE_SHARE, SYNCS_PER_STEP and H2D_BYTES_PER_STEP",
                     (dominant_phase, phase_share, syncs_per_step, h2d_bytes_per_step))
    want = expected_profile() if want is None else want
    shares, largest = want["shares"], want["phase"]
    table = "\n  " + "\n  ".join(f"{k:<10}{v:6.1%}" for k, v in shares.items())
    if dominant_phase not in shares:
        raise AssertionError(f"DOMINANT_PHASE is {dominant_phase!r}; it should be one of "
                             f"{tuple(shares)}, the rows of profile.phases().")
    if shares[dominant_phase] < shares[largest] - SHARE_ATOL:
        raise AssertionError(
            f"DOMINANT_PHASE = {dominant_phase!r}: in the grader's profile of slow_train it took "
            f"{shares[dominant_phase]:.0%} of the step, while {largest!r} took "
            f"{shares[largest]:.0%}. Take the phase with the largest time per step, over the "
            "whole step, not the op at the top of top_ops. The grader's shares:" + table)
    share = as_number(phase_share, "PHASE_SHARE")
    expected = shares[dominant_phase]
    low, high = want.get("share_ranges", {}).get(dominant_phase, (expected, expected))
    if not low - SHARE_ATOL <= share <= high + SHARE_ATOL:
        _check_share_here(share, dominant_phase, expected, (low, high), table)
    for value, name, key, what in ((syncs_per_step, "SYNCS_PER_STEP", "syncs", "syncs"),
                                   (h2d_bytes_per_step, "H2D_BYTES_PER_STEP", "h2d_bytes",
                                    "bytes copied")):
        got = as_number(value, name)
        if not math.isclose(got, want[key], rel_tol=COUNT_RTOL):
            raise AssertionError(f"{name} = {got:g}, expected {want[key]:g} for slow_train's "
                                 f"step: " + _count_hint(got, want, key, what))


def _check_share_here(share: float, phase: str, expected: float, key_range, table: str) -> None:
    """The share, outside the key's runs, against runs measured here and now (see the module)."""
    if 1 < share <= 100 and abs(share / 100 - expected) <= SHARE_ATOL:
        hint = "a share is a fraction between 0 and 1, not a percentage (0.5, not 50)."
        spreads = []
    else:
        _, ranges = measured_shares()
        here_low, here_high = ranges[phase]
        if here_low - SHARE_ATOL <= share <= here_high + SHARE_ATOL:
            return
        hint = ("divide the phase's time per step by the step's time (profile.phases(): "
                ".shares()), over all five phases, 'other' included.")
        spreads = [f"{here_low:.2f} to {here_high:.2f} measured again here"]
    low, high = key_range
    if high > low:
        spreads.insert(0, f"{low:.2f} to {high:.2f} over {PROFILE_RUNS} runs")
    spread = ", ".join([*spreads, f"within {SHARE_ATOL}"])
    raise AssertionError(f"PHASE_SHARE = {share:g} for {phase!r}; the grader's profile gives "
                         f"{expected:.2f} ({spread}): {hint} The grader's shares:{table}")
