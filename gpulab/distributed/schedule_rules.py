"""The rules a pipeline order must follow, and the times that follow from them.

    check_schedule(order, pp_size=4, n_microbatches=8, max_in_flight=[4, 3, 2, 1])

An order holds one list per stage (device) of ("F", i) and ("B", i), or ("F", i, chunk) with
several model chunks per device. The rules, each with its own message (stage, action, rule):

1. one list per stage, each action ("F" or "B", microbatch 0..m-1[, chunk 0..v-1]);
2. every stage runs the forward and the backward of every microbatch (and chunk) exactly once;
3. on a stage, a microbatch's backward comes after its forward (it needs the stored activations);
4. (optional) at most max_in_flight microbatches between forward and backward on a stage: the
   activations it must hold at once. 1F1B holds min(p - s, m) on stage s, GPipe all m;
5. the stages can run their lists in order without waiting for each other forever: a forward on
   virtual stage k needs k - 1's forward of that microbatch, a backward needs k + 1's backward.

normalize_order checks 1-3, simulate_times times the actions and reports 5; check_schedule
does all five. Errors are ScheduleError, a ValueError.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from numbers import Integral

Step = tuple[str, int, int]  # (kind, microbatch, chunk)


class ScheduleError(ValueError):
    """A pipeline order that breaks a rule; the message names the stage, action and rule."""


def label(kind: str, microbatch: int, chunk: int = 0, n_chunks: int = 1) -> str:
    return f"{kind}{microbatch}" + (f" (chunk {chunk})" if n_chunks > 1 else "")


def normalize_order(order, pp_size: int, n_microbatches: int,
                    n_chunks: int = 1) -> list[list[Step]]:
    """Rules 1-3; the order as (kind, microbatch, chunk) triples, one list per stage."""
    p, m, v = pp_size, n_microbatches, n_chunks
    if isinstance(order, (str, bytes)) or not isinstance(order, Sequence) or len(order) != p:
        got = f"{len(order)} lists" if isinstance(order, Sequence) else repr(order)[:60]
        raise ScheduleError(f"the order must hold one list of actions per stage: pp_size={p} "
                            f"lists, got {got}")
    for s, stage in enumerate(order):
        if isinstance(stage, (str, bytes)) or not isinstance(stage, Sequence):
            raise ScheduleError(f"stage {s}: expected a list of actions, got {stage!r:.60}")
    steps = [[_parse(action, s, k, m, v) for k, action in enumerate(stage)]
             for s, stage in enumerate(order)]
    for s, stage in enumerate(steps):
        counts = Counter(stage)
        for step, n in counts.items():
            if n > 1:
                where = ", ".join(str(k) for k, x in enumerate(stage) if x == step)
                what = "forward" if step[0] == "F" else "backward"
                raise ScheduleError(f"stage {s} runs {label(*step, v)} {n} times (positions "
                                    f"{where}): each stage runs every microbatch's {what} "
                                    "exactly once")
        for kind in ("F", "B"):
            for mb in range(m):
                for chunk in range(v):
                    if (kind, mb, chunk) not in counts:
                        raise ScheduleError(
                            f"stage {s} never runs {label(kind, mb, chunk, v)}: every stage runs "
                            f"one forward and one backward of every microbatch (F0..F{m - 1} and "
                            f"B0..B{m - 1}" + (f", for each of the {v} chunks" if v > 1 else "")
                            + ")")
        position = {step: k for k, step in enumerate(stage)}
        for k, (kind, mb, chunk) in enumerate(stage):
            if kind == "B" and position[("F", mb, chunk)] > k:
                raise ScheduleError(
                    f"stage {s} runs {label('B', mb, chunk, v)} (position {k}) before "
                    f"{label('F', mb, chunk, v)} (position {position[('F', mb, chunk)]}): a "
                    "stage can only run a microbatch's backward after its forward, which stored "
                    "the activations the backward needs")
    return steps


def simulate_times(steps: list[list[Step]], pp_size: int, n_microbatches: int, n_chunks: int,
                   cost: dict[str, list[float]], comm: float = 0.0) -> list[list[tuple]]:
    """(start, end) of every step: each stage runs its list in order, each step as soon as the
    stage is free and its inputs have arrived (comm later when they come from another device).
    cost[kind][stage] is the duration of one step. Raises ScheduleError on a deadlock (rule 5)."""
    p, v = pp_size, n_chunks
    end: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, virtual stage) -> end time
    times: list[list[tuple]] = [[] for _ in range(p)]
    free = [0.0] * p
    pos = [0] * p
    remaining = sum(len(stage) for stage in steps)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(steps[s]):
                kind, mb, chunk = steps[s][pos[s]]
                deps = _dependencies(kind, mb, chunk * p + s, p, v)
                if any(d not in end for d, _ in deps):
                    break
                ready = max((end[d] + (comm if device != s else 0.0) for d, device in deps),
                            default=0.0)
                start = max(free[s], ready)
                free[s] = start + cost[kind][s]
                end[(kind, mb, chunk * p + s)] = free[s]
                times[s].append((start, free[s]))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ScheduleError(_deadlock_message(steps, pos, end, p, v))
    return times


def check_schedule(order, pp_size: int, n_microbatches: int, n_chunks: int = 1,
                   max_in_flight: int | Sequence[int] | None = None) -> None:
    """Check a per-stage order against rules 1-5 (module doc); None when it follows them all,
    else ScheduleError naming the stage, the action and the rule.

    max_in_flight: the most microbatches (microbatch-chunks when n_chunks > 1) a stage may hold
    between forward and backward, one number for every stage or one per stage. None: no limit
    (GPipe holds all m). For 1F1B pass [p - s for s in range(p)], or p for a looser bound."""
    steps = normalize_order(order, pp_size, n_microbatches, n_chunks)
    if max_in_flight is not None:
        limits = ([max_in_flight] * pp_size if isinstance(max_in_flight, int)
                  else list(max_in_flight))
        if len(limits) != pp_size:
            raise ValueError(f"max_in_flight needs one limit per stage ({pp_size}), got {limits}")
        for s, stage in enumerate(steps):
            _check_in_flight(stage, s, limits[s], pp_size, n_chunks)
    unit = {"F": [1.0] * pp_size, "B": [2.0] * pp_size}
    simulate_times(steps, pp_size, n_microbatches, n_chunks, unit)


def _parse(action, stage: int, k: int, m: int, v: int) -> Step:
    shape = "('F', i, chunk) or ('B', i, chunk)" if v > 1 else "('F', i) or ('B', i)"
    ok = isinstance(action, (tuple, list)) and len(action) in ((2, 3) if v == 1 else (3,))
    if ok:
        kind, mb, chunk = (*action, 0) if len(action) == 2 else action
        ok = (kind in ("F", "B") and _is_index(mb, m) and _is_index(chunk, v))
    if not ok:
        raise ScheduleError(
            f"stage {stage}, position {k}: {action!r} is not an action. Write {shape} for the "
            f"forward or backward of microbatch i, with 0 <= i < n_microbatches = {m}"
            + (f" and 0 <= chunk < n_chunks = {v}" if v > 1 else ""))
    return (kind, int(mb), int(chunk))  # plain ints: numpy integers hash and print alike


def _is_index(value, size: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and 0 <= value < size


def _dependencies(kind: str, mb: int, virtual: int, p: int, v: int) -> list[tuple]:
    """What (kind, microbatch, virtual stage) must end first, and on which device it runs."""
    if kind == "F":
        return [] if virtual == 0 else [(("F", mb, virtual - 1), (virtual - 1) % p)]
    deps = [(("F", mb, virtual), virtual % p)]
    if virtual < p * v - 1:
        deps.append((("B", mb, virtual + 1), (virtual + 1) % p))
    return deps


def _check_in_flight(stage: list[Step], s: int, limit: int, p: int, v: int) -> None:
    held: list[Step] = []
    for k, (kind, mb, chunk) in enumerate(stage):
        if kind == "B":
            held.remove(("F", mb, chunk))
            continue
        held.append((kind, mb, chunk))
        if len(held) > limit:
            names = ", ".join(label(*x, v) for x in held)
            raise ScheduleError(
                f"stage {s} holds {len(held)} microbatches in flight after "
                f"{label(kind, mb, chunk, v)} (position {k}): {names} have run forward there "
                f"and not yet backward, so their activations are all in memory. The limit is "
                f"{limit}" + (f" (1F1B holds at most p - s = {p - s} on stage {s})" if v == 1
                              else "") + ": run a backward before the next forward")


def _deadlock_message(steps, pos, end, p: int, v: int) -> str:
    lines = []
    for s in range(p):
        if pos[s] == len(steps[s]):
            continue
        kind, mb, chunk = steps[s][pos[s]]
        missing = [(d, device) for d, device in _dependencies(kind, mb, chunk * p + s, p, v)
                   if d not in end]
        (dep_kind, dep_mb, dep_virtual), device = missing[0]
        dep = (dep_kind, dep_mb, dep_virtual // p)
        at = steps[device].index(dep)
        lines.append(f"stage {s} waits at position {pos[s]} to run {label(kind, mb, chunk, v)}: "
                     f"it needs {label(*dep, v)} from stage {device} first, which stage "
                     f"{device} has at position {at} of its list")
    return ("the order deadlocks. Each stage runs its list strictly in order, and these wait "
            "for each other forever:\n  " + ";\n  ".join(lines) + ".\nA forward needs the "
            "previous stage's forward of the same microbatch, a backward needs the next "
            "stage's backward of it: order each stage's list so that what it waits for can "
            "run first.")
