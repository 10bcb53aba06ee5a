"""Data races and barrier bugs, found from a trace instead of by luck.

The rule is CUDA's: two accesses to one element by different threads conflict when at least
one is a plain write (atomics do not conflict with atomics, nor with plain reads). Within a
block, accesses in different barrier intervals (epochs) are ordered by the cuda.syncthreads()
between them; accesses of different blocks are never ordered within one launch (there is no
grid-wide barrier). A conflict that nothing orders is a race.

    races_in(trace)                               # [] when clean (a trace of run_traced)
    explain(kernel_name, races, barrier_errors)   # the message of a RaceError

find_races and check_no_races (trace.py) run a kernel traced and judge it here; this module
reads a trace and imports nothing of trace.py.

One Race per element (per element and block, for shared memory): the first conflict the
launch makes on it. Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

from gpulab.sim.memory import ATOMIC_K, READ_K, WRITE_K
from gpulab.sim.records import (
    ATOMIC,
    READ,
    WRITE,
    Race,
    format_index,
    format_interval,
)

# kinds of an earlier access that a new access of each kind conflicts with
_CONFLICTS = {READ_K: (WRITE_K,), WRITE_K: (READ_K, WRITE_K, ATOMIC_K), ATOMIC_K: (WRITE_K,)}
MAX_PATTERNS = 3  # how many kinds of race a RaceError message describes in full


class _Element:
    """What races.py remembers about one element: the first access of each kind so far, in
    earlier blocks, in the current block, and in the current barrier interval (with a second
    one from another thread, in case the new access comes from the first one's thread)."""

    __slots__ = ("block", "epoch", "prev", "this_block", "first", "other")

    def __init__(self, block, epoch):
        self.block, self.epoch = block, epoch
        self.prev = [None, None, None]  # record positions, by kind, in earlier blocks
        self.this_block = [None, None, None]
        self.first = [None, None, None]  # in this block and epoch
        self.other = [None, None, None]  # same, from a thread other than first's


def races_in(trace) -> list[Race]:
    """The races of a Trace: one per element, sorted by array and element."""
    recs = trace.records
    shared = {aid for aid, a in enumerate(trace.arrays) if a.space == "shared"}
    elements: dict[tuple, _Element | None] = {}
    found = []
    for pos, (blk, thr, aid, flat, kind, epoch, *_) in enumerate(recs):
        key = (aid, blk, flat) if aid in shared else (aid, -1, flat)
        el = elements.get(key, False)
        if el is None:  # already has its race
            continue
        if el is False:
            el = elements[key] = _Element(blk, epoch)
        elif blk != el.block:  # blocks run one after another: fold the last one into prev
            el.prev = [_earliest(p, b) for p, b in zip(el.prev, el.this_block, strict=True)]
            el.this_block = [None, None, None]
            el.first, el.other = [None, None, None], [None, None, None]
            el.block, el.epoch = blk, epoch
        elif epoch != el.epoch:  # a barrier orders what came before it (skipped: see scheduler)
            el.first, el.other = [None, None, None], [None, None, None]
            el.epoch = epoch
        partner = None
        for k in _CONFLICTS[kind]:
            same = el.first[k]
            if same is not None and recs[same][1] == thr:
                same = el.other[k]
            partner = _earliest(partner, _earliest(el.prev[k], same))
        if partner is not None:
            found.append((key, partner, pos))
            elements[key] = None
            continue
        if el.first[kind] is None:
            el.first[kind] = pos
        elif el.other[kind] is None and recs[el.first[kind]][1] != thr:
            el.other[kind] = pos
        if el.this_block[kind] is None:
            el.this_block[kind] = pos
    found.sort(key=lambda f: f[0])
    return [_race(trace, recs[a], recs[b]) for _, a, b in found]


def _earliest(a, b):
    if a is None:
        return b
    return a if b is None or a < b else b


def _race(trace, rec_a, rec_b) -> Race:
    """Orient the pair: the access that comes earlier in its thread's program (after the same
    number of barriers) goes first; a tie keeps launch order."""
    if (rec_b[5], rec_b[6]) < (rec_a[5], rec_a[6]):
        rec_a, rec_b = rec_b, rec_a
    first, second = trace.access(rec_a), trace.access(rec_b)
    return Race(array=first.array, space=first.space, index=first.index,
                kind=f"{first.kind}-{second.kind}", first=first, second=second,
                lost_update=_both_update(trace.records, rec_a, rec_b))


def _both_update(records, rec_a, rec_b) -> bool:
    """True when each of the two threads both reads and writes the element on the racing line:
    the read-add-write of `x[i] += 1` done by many threads."""
    aid, flat, line = rec_a[2], rec_a[3], rec_a[7]
    if rec_b[7] != line:
        return False
    threads = {(rec_a[0], rec_a[1]), (rec_b[0], rec_b[1])}  # (block, thread)
    done = {(r[0], r[1], r[4]) for r in records
            if r[2] == aid and r[3] == flat and r[7] == line and (r[0], r[1]) in threads}
    return all((blk, thr, k) in done for blk, thr in threads for k in (READ_K, WRITE_K))


# ----------------------------------------------------------------------------- the message


def explain(kernel_name: str, races, barrier_errors=()) -> str:
    """A teacher's account: each kind of problem once, with an example and a likely fix."""
    parts = []
    if barrier_errors:
        parts.append(_explain_barriers(kernel_name, barrier_errors))
    if races:
        parts.append(_explain_races(kernel_name, races))
    return "\n\n".join(parts)


def _explain_barriers(kernel_name, errors) -> str:
    groups: dict[tuple, list] = {}
    for e in errors:
        groups.setdefault((e.lines, bool(e.exited)), []).append(e)
    text = [f"{kernel_name}: {len(errors)} cuda.syncthreads() call(s) not reached by every "
            "thread of the block. On a GPU that can hang or give wrong results; the simulator "
            "just lets the waiting threads go."]
    for (lines, exited), group in list(groups.items())[:MAX_PATTERNS]:
        e = group[0]
        text.append(f"  - {e}.")
        if exited:
            text.append("    Every thread of a block must reach every cuda.syncthreads(). "
                        "Instead of returning early (or skipping the barrier inside an `if`), "
                        "put only the work under the `if` and let every thread reach the "
                        "barrier.")
        else:
            text.append(f"    Threads wait at different barriers (lines "
                        f"{', '.join(map(str, lines))}): move cuda.syncthreads() out of the "
                        "branches so that the whole block meets at one.")
        if len(group) > 1:
            text.append(f"    (the same in {len(group) - 1} more place(s))")
    if len(groups) > MAX_PATTERNS:
        text.append(f"  ... and {len(groups) - MAX_PATTERNS} more kind(s) of barrier problem")
    return "\n".join(text)


def _explain_races(kernel_name, races) -> str:
    groups: dict[tuple, list] = {}
    for r in races:
        key = (r.array, r.space, r.first.line, r.second.line, r.kind, r.same_block)
        groups.setdefault(key, []).append(r)
    arrays = sorted({f"`{r.array}` ({r.space})" for r in races})
    text = [f"{kernel_name}: data race on {len(races)} element(s) of {', '.join(arrays)}."]
    for group in list(groups.values())[:MAX_PATTERNS]:
        r = group[0]
        text.append(f"  - {format_index(r.array, r.index)}: {r.first.who()} {r.first.kind}s it "
                    f"on {r.first.where()}, and {r.second.who()} {r.second.kind}s it on "
                    f"{r.second.where()}, "
                    + (f"both {format_interval(r.first.epoch)}." if r.same_block else
                       "and nothing orders two blocks."))
        text.append("    " + hint(r))
        if len(group) > 1:
            text.append(f"    (the same on {len(group) - 1} more element(s) of {r.array})")
    rest = sum(len(g) for g in list(groups.values())[MAX_PATTERNS:])
    if rest:
        text.append(f"  ... and {rest} more race(s) of {len(groups) - MAX_PATTERNS} other "
                    "kind(s): fix these first and check again.")
    return "\n".join(text)


def hint(race: Race) -> str:
    """What was probably forgotten, for one race."""
    a, b = race.first, race.second
    at = format_index(race.array, race.index)
    same_line = a.line == b.line and a.file == b.file
    kinds = {a.kind, b.kind}
    if same_line and kinds == {READ, WRITE} and race.lost_update:
        return (f"`{a.code}` is a read, an add and a write: two threads can read the same old "
                f"value and one update is lost. Use cuda.atomic.add on {at} (or another "
                "cuda.atomic.* op), or give each thread its own element and combine them later.")
    if same_line and kinds == {WRITE}:
        return (f"Several threads write {at} on the same line: check the index, so that each "
                "thread writes its own element, or let one thread write (e.g. "
                "`if cuda.threadIdx.x == 0:`), or use cuda.atomic.*.")
    if ATOMIC in kinds:
        return (f"{at} is updated with cuda.atomic.* and written plainly: make every update "
                "atomic, or separate them with a cuda.syncthreads() (within a block) or two "
                "kernel launches (across blocks).")
    if not race.same_block:
        return ("Blocks run in no fixed order and cuda.syncthreads() waits only for the "
                "threads of one block. Give each block its own elements (check that the index "
                "uses cuda.grid / cuda.blockIdx), use cuda.atomic.*, or split the work into two "
                "kernel launches.")
    text = (f"A cuda.syncthreads() between the {a.kind} on line {a.line} and the {b.kind} on "
            f"line {b.line}?")
    if b.line <= a.line:
        text += (f" Line {b.line} runs again in the next loop iteration, so the barrier "
                 f"belongs at the end of the loop body, after line {a.line}.")
    return text

