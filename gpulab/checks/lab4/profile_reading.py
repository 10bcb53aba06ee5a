"""Lab 4, Part B1: read slow_train's profile (check_profile_reading).

The learner profiles one step of slow_train at a time (profile_steps for the phases,
count_transfers for the host-device traffic) and answers from what they read: the largest phase,
its share of the step, the syncs per step and the bytes copied to the device per step.

The counts are exact on either runner, and their expected values come from `expected_profile`,
which the grader runs outside the learner's kernel (gpulab/checks/keys.py). The share is a
timing, and no key measured at another moment can grade it: on 2 busy cores the same step's
"data" share moved from 0.65 in the grader's runs to 0.77 in the learner's profile a few seconds
later. So the phase and the share are graded as a reading of the learner's own `profile`, to
READ_ATOL, once that profile is shown to be slow_train's: its calls per step (phases and ops,
which no load changes) must be the key's, and its largest phase's share must lie within
BUSY_ATOL of the grader's runs. Only a profile taken beside heavy load misses that (the message
says so before any reading is graded), and a profile edited to fit an answer cannot escape it.
The integrity guard watches the profiler and the clocks in the learner's kernel, as it does for
the speed-up.
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import math
from collections import Counter

from gpulab.checks.harness.numbers import as_number
from gpulab.checks.harness.training import one_thread
from gpulab.checks.lab4.diagnosis import require_answered
from gpulab.profiling import ProfileResult, profile_steps
from gpulab.profiling.trace import within
from gpulab.profiling.transfers import count_transfers
from gpulab.slow_pipeline import MICRO_BATCH_SIZE, pipeline_problem, slow_train

READ_ATOL = 0.02  # a share read off the profile, rounded to a printed digit or two
BUSY_ATOL = 0.25  # beyond the grader's runs: what heavy load beside a profile can shift
COUNT_RTOL = 0.01  # syncs and bytes are counted, not timed: exact up to how they are written
PROFILED_STEPS, COUNTED_STEPS = 3, 2
PROFILE_RUNS = 3  # the grader's runs, for the range of each share
# The transform's pixel-by-pixel work and the model's matmuls: counts that say "slow_train".
SIGNATURE_OPS = ("aten::select", "aten::lift_fresh", "aten::addmm")


def slow_step(problem):
    """(one step of slow_train on a fresh model, each call on the next batch; the model)."""
    model = problem.new_model()
    optimizer = problem.new_optimizer(model)
    seeds = iter(range(1_000_000))

    def one_slow_step():
        slow_train(model, optimizer, problem.images, problem.labels, steps=1,
                   batch_size=problem.batch_size, seed=next(seeds))

    return one_slow_step, model


def calls_per_step(profile: ProfileResult) -> dict[str, float]:
    """How often each labelled phase and each of SIGNATURE_OPS ran in a profiled step."""
    calls = Counter(span.name for span in profile.phase_spans
                    if within(span.start_s, profile.steps) is not None)
    calls.update(op.name for op in ProfileResult.ops_in_steps(profile) if op.name in SIGNATURE_OPS)
    return {name: calls[name] / len(profile.steps) for name in sorted(calls)}


def shares_of(profile: ProfileResult) -> dict[str, float]:
    """The profile's shares, read through the class: an instance cannot shadow the method."""
    return {k: float(v) for k, v in ProfileResult.phases(profile).shares().items()}


@one_thread()
def expected_profile() -> dict:
    """Each phase's [lowest, highest] share of slow_train's step over PROFILE_RUNS profiles, its
    calls per step, and its syncs, copies to the device and their bytes per step, as plain
    values."""
    problem = pipeline_problem()
    step, model = slow_step(problem)
    profiles = [profile_steps(step, steps=PROFILED_STEPS, warmup=1) for _ in range(PROFILE_RUNS)]
    runs = [shares_of(profile) for profile in profiles]
    counts = count_transfers(step, model, steps=COUNTED_STEPS)
    return {"share_ranges": {k: [min(r[k] for r in runs), max(r[k] for r in runs)]
                             for k in runs[0]},
            "calls": calls_per_step(profiles[0]), "syncs": counts.syncs,
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
                          profile, want: dict | None = None) -> None:
    """The largest phase of slow_train's step and its share of the step (a fraction), as
    `profile` (the learner's profile_steps result) shows them, and the step's host-device syncs
    and bytes copied host-to-device, against `want` (expected_profile: the grader's answer key;
    computed here when None)."""
    require_answered("DOMINANT_PHASE, PHASE_SHARE, SYNCS_PER_STEP and H2D_BYTES_PER_STEP",
                     (dominant_phase, phase_share, syncs_per_step, h2d_bytes_per_step))
    want = expected_profile() if want is None else want
    shares = _own_shares(profile, want)
    table = "\n  " + "\n  ".join(f"{k:<10}{v:6.1%}" for k, v in shares.items())
    if dominant_phase not in shares:
        raise AssertionError(f"DOMINANT_PHASE is {dominant_phase!r}; it should be one of "
                             f"{tuple(shares)}, the rows of profile.phases().")
    largest = max(shares, key=shares.get)
    if shares[dominant_phase] < shares[largest] - READ_ATOL:
        raise AssertionError(
            f"DOMINANT_PHASE = {dominant_phase!r}: take the phase with the largest time per "
            f"step, over the whole step, not the op at the top of top_ops. In your profile "
            f"{dominant_phase!r} took {shares[dominant_phase]:.0%} of the step and {largest!r} "
            f"took {shares[largest]:.0%}. Your profile's shares:" + table)
    share, own = as_number(phase_share, "PHASE_SHARE"), shares[dominant_phase]
    if abs(share - own) > READ_ATOL:
        hint = ("a share is a fraction between 0 and 1, not a percentage (0.5, not 50)"
                if 1 < share <= 100 and abs(share / 100 - own) <= READ_ATOL else
                "divide the phase's time per step by the step's time (profile.phases(): "
                ".shares()), over all five phases, 'other' included")
        raise AssertionError(f"PHASE_SHARE = {share:g}: {hint}. Your profile gives "
                             f"{own:.3f} for {dominant_phase!r}. Your profile's shares:" + table)
    for value, name, key, what in ((syncs_per_step, "SYNCS_PER_STEP", "syncs", "syncs"),
                                   (h2d_bytes_per_step, "H2D_BYTES_PER_STEP", "h2d_bytes",
                                    "bytes copied")):
        got = as_number(value, name)
        if not math.isclose(got, want[key], rel_tol=COUNT_RTOL):
            raise AssertionError(f"{name} = {got:g}, expected {want[key]:g} for slow_train's "
                                 f"step: " + _count_hint(got, want, key, what))


def _own_shares(profile, want: dict) -> dict[str, float]:
    """The shares of the learner's `profile`, once it is shown to be a profile of slow_train
    whose largest phase took about the share it takes in the grader's runs."""
    if type(profile) is not ProfileResult:
        raise AssertionError(
            "Run the profiling cell above (profile = profile_steps(one_slow_step, ...)) before "
            f"this one: `profile` is a {type(profile).__name__}, not what profile_steps returns.")
    calls = calls_per_step(profile)
    for name, expected in want["calls"].items():
        if not math.isclose(calls.get(name, 0.0), expected, rel_tol=COUNT_RTOL):
            raise AssertionError(
                "Profile slow_train's step as the profiling cell above does, one step per "
                f"call: in `profile`, {name!r} ran {calls.get(name, 0.0):g} times a step, and "
                f"{expected:g} times in a step of slow_train.")
    shares = shares_of(profile)
    largest = max(shares, key=shares.get)
    low, high = want["share_ranges"][largest]
    if not low - BUSY_ATOL <= shares[largest] <= high + BUSY_ATOL:
        raise AssertionError(
            f"Run the profiling cell again on a quiet machine, then this cell: in your profile "
            f"{largest!r} took {shares[largest]:.0%} of the step, and {low:.0%} to {high:.0%} in "
            f"the grader's runs of the same step. Other work on the machine (another notebook, "
            f"PyTorch threads fighting for cores) shifts a profile's timings.")
    return shares
