"""Checker for Lab 5, Part 3 (solutions/lab5_parallelism_across_nodes/...): the 1F1B order of
one pipeline stage, written by the learner. No processes: an order is a list.

    check_one_f_one_b(one_f_one_b_stage, p=4, m=8)

one_f_one_b_stage(p, m, stage) returns ONE stage's list of ("F", i) and ("B", i). For every
stage the checker compares it with 1F1B (PipeDream-Flush, Megatron's default): w = min(p -
stage - 1, m) warm-up forwards, then m - w pairs (one forward, one backward), then the last w
backwards. The spec leaves w to the learner (hints.py level 3 has it), so the messages name
this stage's counts, never the formula. When they differ it says why in the terms of lesson 06:
GPipe (all forwards first),
a warm-up one too long or too short, a microbatch that does not exist (m < p), and otherwise
the rule gpulab's check_schedule finds broken, with the other stages running 1F1B: every F and
B once, a backward after its forward, at most p - stage microbatches in flight, no deadlock.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import sys
from numbers import Integral

from gpulab.checks.harness.owned import LIBRARY_DIR, require_own_function
from gpulab.distributed.schedule import one_f_one_b_order
from gpulab.distributed.schedule_rules import ScheduleError, check_schedule, normalize_order

SCHEDULE_CODE = str(LIBRARY_DIR / "distributed")  # gpulab's schedules: not the learner's
HINT = 'gpulab.hint("lab5", "one_f_one_b")'


def check_one_f_one_b(one_f_one_b_stage, p: int = 4, m: int = 8) -> None:
    """one_f_one_b_stage(p, m, stage), for every stage, is the 1F1B order of that stage; the
    stages together pass check_schedule with at most p - stage microbatches in flight."""
    require_own_function(one_f_one_b_stage, "one_f_one_b_stage")
    want = one_f_one_b_order(p, m)
    got = []
    for stage in range(p):
        order = call_order(one_f_one_b_stage, f"one_f_one_b_stage(p={p}, m={m}, stage={stage})",
                           "one_f_one_b_order", "('F', i) and ('B', i)", p, m, stage)
        if order != want[stage]:
            raise AssertionError(f"one_f_one_b_stage(p={p}, m={m}, stage={stage}) returned "
                                 f"{_text(order)}.\n{_mistake(order, want, p, m, stage)}")
        got.append(order)
    try:
        check_schedule(got, p, m, max_in_flight=[p - s for s in range(p)])
    except ScheduleError as error:  # the reference itself: never expected
        raise AssertionError(f"1F1B with p={p}, m={m} broke a rule: {error}") from None


def call_order(fn, call: str, library: str, actions: str, *args) -> list:
    """fn(*args) as a list of tuples; AssertionError when it raises, returns something other
    than a list (of `actions`), or runs gpulab's own schedules (`library`: the one to copy)."""
    borrowed = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(SCHEDULE_CODE):
            borrowed.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}: "
                            f"{frame.f_code.co_name}")

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        order = fn(*args)
    except NotImplementedError:
        raise AssertionError(f"{call} raised NotImplementedError. Replace `raise "
                             "NotImplementedError()` with your code.") from None
    except Exception as error:  # the learner's code may raise anything; say where
        raise AssertionError(f"{call} raised {type(error).__name__}: {error}") from error
    finally:
        sys.setprofile(previous)
    if borrowed:
        raise AssertionError(f"{call} ran gpulab's own code ({borrowed[0]}): build the order "
                             f"yourself; gpulab's {library} (lesson 06) earns no points.")
    if not isinstance(order, list | tuple):
        raise AssertionError(f"{call} returned {type(order).__name__}: return a list of "
                             f"{actions} tuples.")
    return [tuple(a) if isinstance(a, list | tuple) else a for a in order]


def _text(order: list) -> str:
    """F0 F1 B0 ... (the lesson's labels), or the list itself when it holds other things."""
    if all(_is_action(a, None) for a in order):
        return " ".join(f"{kind}{i}" for kind, i in order) or "an empty list"
    return repr(order) if len(repr(order)) < 300 else repr(order)[:300] + "..."


def _is_action(action, m: int | None) -> bool:
    return (isinstance(action, tuple) and len(action) == 2 and action[0] in ("F", "B")
            and isinstance(action[1], Integral) and not isinstance(action[1], bool)
            and action[1] >= 0 and (m is None or action[1] < m))


def _pattern(m: int, warmup: int) -> list[tuple[str, int]]:
    """1F1B's shape with a given warm-up: `warmup` forwards, then pairs, then the rest."""
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def _mistake(order: list, want: list[list], p: int, m: int, stage: int) -> str:
    warmup = min(p - stage - 1, m)
    rule = (f"1F1B on stage {stage} of p = {p} with m = {m}: {warmup} warm-up forwards, then "
            f"{m - warmup} pairs (one forward, one backward), then the last {warmup} backwards. "
            f'{HINT} shows why.')
    bad = next((k for k, a in enumerate(order) if not _is_action(a, m)), None)
    if bad is not None:
        action = order[bad]
        if _is_action(action, None) and m < p:
            return (f"Position {bad}, {action[0]}{action[1]}, names a microbatch that does not "
                    f"exist: there are m = {m} (F0..F{m - 1}). With m < p the warm-up is cut "
                    f"short: a stage cannot run more forwards than there are microbatches. "
                    f"{rule}")
        return (f"Position {bad}, {action!r}, is not an action: write ('F', i) or ('B', i), "
                f"0 <= i < m = {m}.")
    forwards = [("F", i) for i in range(m)]
    if order in (forwards + [("B", i) for i in range(m)],
                 forwards + [("B", i) for i in reversed(range(m))]):
        return (f"That is GPipe: stage {stage} holds all m = {m} microbatches' activations "
                f"before its first backward; 1F1B holds at most p - stage = {p - stage}, "
                f"whatever m is. {rule}")
    others = [list(s) for s in want]
    others[stage] = order
    try:
        normalize_order(others, p, m)  # every F and B once, each B after its F
    except ScheduleError as error:
        return f"It breaks a rule: {str(error).rstrip('.')}."
    tried = next((k for k in range(m + 1) if k != warmup and order == _pattern(m, k)), None)
    if tried is not None:
        more = tried > warmup
        why = (f"then stage {stage} holds {tried + 1} microbatches at once in the steady state, "
               f"more than it needs: the last stage runs each backward right after its forward, "
               f"so the first backward reaches stage {stage} after p - stage - 1 = "
               f"{p - stage - 1} more forwards." if more else
               f"then stage {stage} asks for a backward before the stages after it can have "
               "sent it back, and waits idle: the pipeline after this stage needs "
               f"p - stage - 1 = {p - stage - 1} microbatches in it to keep busy.")
        forwards = "forward" if tried == 1 else "forwards"
        return (f"Its warm-up is {tried} {forwards}, {'too many' if more else 'too few'}: "
                f"{why} {rule}")
    try:
        check_schedule(others, p, m, max_in_flight=[p - s for s in range(p)])
    except ScheduleError as error:
        return (f"With the other stages running 1F1B, it breaks a rule: "
                f"{str(error).rstrip('.')}.\n{rule}")
    # rules 1-3 hold, so the lists have the same length: name the first difference
    k = next(k for k, (a, b) in enumerate(zip(order, want[stage], strict=True)) if a != b)
    (kind, i), (want_kind, want_i) = order[k], want[stage][k]
    return (f"Position {k} is {kind}{i}; 1F1B runs {want_kind}{want_i} there (a valid order, "
            f"but not 1F1B's). {rule}")
