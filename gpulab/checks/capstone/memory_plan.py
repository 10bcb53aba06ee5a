"""Capstone, Part 2: the plan's memory, predicted and measured (check_memory_plan,
check_prediction_follows_plan).
"""

from __future__ import annotations

import dataclasses

from gpulab.capstone import capstone_config
from gpulab.checks.capstone.common import (
    PREDICTION_TOLERANCE,
    launch_on_cluster,
    require_learner_code,
    require_valid_plan,
)
from gpulab.checks.harness.owned import require_own_function
from gpulab.memory import format_bytes
from gpulab.stubs import STUB_HINT


def check_memory_plan(predict_memory, shard_model, plan, *, seed: int = 0,
                      isolation: str = "auto", course_config: dict | None = None) -> None:
    """Measure every rank's peak during a steady-state step of the plan on the cluster; it must
    stay within plan.budget_bytes, and predict_memory(config, plan) within 10% of it. The
    config is the course's: `course_config` (the grader's answer key) when given."""
    require_own_function(predict_memory, "predict_memory")
    require_learner_code(shard_model, "shard_model")
    config = capstone_config(None, seed=seed)
    _require_course_config(config, course_config)
    require_valid_plan(plan, config)
    try:
        predicted = predict_memory(config, plan)
    except NotImplementedError:
        raise AssertionError(f"predict_memory raised NotImplementedError. {STUB_HINT}") from None
    if isinstance(predicted, bool) or not isinstance(predicted, int | float) or predicted <= 0:
        raise AssertionError(f"predict_memory returned {predicted!r}; return the predicted peak "
                             "bytes of one rank, a positive number.")
    run = launch_on_cluster("check_memory_plan", {"shard_model": shard_model}, plan, config,
                            steps=2, measure_step=1, isolation=isolation)
    peaks = run.peak_bytes
    kinds = run.ranks[max(range(len(peaks)), key=peaks.__getitem__)]["peak_by_kind"]
    shown = ", ".join(f"{k} {format_bytes(v)}" for k, v in kinds.items() if v and k != "Total")
    print(f"measured peak per rank: {', '.join(map(format_bytes, peaks))} ({shown}); "
          f"predicted {format_bytes(int(predicted))}; budget {format_bytes(plan.budget_bytes)}")
    worst = max(peaks)
    if worst > plan.budget_bytes:
        raise AssertionError(f"a rank peaked at {format_bytes(worst)}, over the plan's budget of "
                             f"{format_bytes(plan.budget_bytes)}: lower the peak (activation "
                             "checkpointing, more grad_accum_steps) or state a budget that "
                             "the plan meets.")
    error = predicted / worst - 1
    if abs(error) > PREDICTION_TOLERANCE:
        missing = "more than was there" if error > 0 else "less than was there"
        raise AssertionError(
            f"predict_memory says {format_bytes(int(predicted))}, the measured peak is "
            f"{format_bytes(worst)} ({error:+.0%}, {missing}; within 10% is needed). At the "
            f"peak the rank held: {shown}. Each rank keeps 1/dp_size of the fp32 weights and "
            "AdamW state (model_states with zero_stage=3), one microbatch's activations in the "
            "gathered dtype (estimate_transformer), and the Blocks gathered at that moment.")


def _require_course_config(config, course_config: dict | None) -> None:
    """AssertionError when this kernel's capstone config is not the one the grader computed."""
    if course_config is None:
        return
    mine = dataclasses.asdict(config)
    changed = [f"{k} is {mine.get(k)!r}, the course's {v!r}" for k, v in course_config.items()
               if mine.get(k) != v]
    if changed:
        raise AssertionError(f"capstone_config() in this kernel is not the course's "
                             f"({'; '.join(changed[:3])}): gpulab.capstone was changed in this "
                             "notebook. Restart the kernel and run the notebook without that "
                             "change.")


def check_prediction_follows_plan(predict_memory, plan, *, seed: int = 0) -> None:
    """No launch: predict_memory must read the plan. More data-parallel ranks share the model
    states (less per rank); checkpointing and more microbatches shrink the activations."""
    require_own_function(predict_memory, "predict_memory")
    config = capstone_config(None, seed=seed)
    base = dataclasses.replace(plan, tp_size=1, activation_checkpointing=False,
                               grad_accum_steps=1)
    cases = (("dp_size 4 instead of 2", dataclasses.replace(base, dp_size=2),
              dataclasses.replace(base, dp_size=4, grad_accum_steps=2)),
             ("activation checkpointing on", base,
              dataclasses.replace(base, activation_checkpointing=True)))
    for change, before, after in cases:
        try:
            old, new = predict_memory(config, before), predict_memory(config, after)
        except NotImplementedError:
            raise AssertionError(f"predict_memory raised NotImplementedError. {STUB_HINT}") \
                from None
        if not new < old:
            raise AssertionError(f"predict_memory gives {format_bytes(int(new))} with "
                                 f"{change}, against {format_bytes(int(old))} before: it must "
                                 "fall. Read dp_size, micro_batch_size and "
                                 "activation_checkpointing from the plan.")


