"""Pipeline schedules on paper: GPipe, 1F1B and interleaved 1F1B, laid out in time.

    s = schedule_1f1b(4, 8)         # pp_size p=4 stages, n_microbatches m=8, tf=1, tb=2
    print(s.text())                 # one line per stage: "stage 0: F0 F1 F2 F3 .  .  ..."
    s.bubble_fraction               # idle / (p * makespan) = (p-1)/(m+p-1) = 3/11
    s.peak_in_flight                # [4, 3, 2, 1]: activations held, min(p - s, m) on stage s
    draw_schedule(s)                # the picture (schedule_draw.py)
    check_schedule(order, 4, 8)     # a hand-written order against the rules, messages that teach

An order is one list of actions per stage (one device): ("F", i) is the forward of microbatch
i, ("B", i) its backward; with v model chunks per device (interleaved) ("F", i, c) names chunk
c, which is virtual stage c * p + stage. `simulate_schedule` runs each stage's list in
order, every action as early as its dependencies allow:

    F of i on virtual stage k   after F of i on k - 1 (+ comm if that is another device)
    B of i on virtual stage k   after B of i on k + 1 (+ comm), and after F of i on k

with cost tf (forward) and tb (backward, 2 tf by default: two matmuls per forward matmul) per
microbatch per stage, tf / v and tb / v per chunk. The three reference orders:

    gpipe_order          all forwards, then all backwards (in forward order; the reverse
                         order gives the same times); every stage holds all m activations
    one_f_one_b_order    PipeDream-Flush / Megatron 1F1B: min(p - s - 1, m) warm-up forwards,
                         then one forward, one backward; at most min(p - s, m) in flight
    interleaved_order    Megatron's interleaved 1F1B (m a multiple of p): forwards in groups of
                         p microbatches per chunk, (p - s - 1) * 2 + (v - 1) * p warm-up forwards

Bubble, two definitions (uniform costs, comm = 0: the simulator gives these exactly, whatever
tb / tf; the tests check it). Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", Sec. 2.2: bubble time t_pb = (p-1)(tf+tb), ideal
time t_id = m (tf+tb), and with v chunks t_pb = (p-1)(tf+tb)/v. So

    bubble_ratio     idle / busy = t_pb / t_id = (p-1) / (v m)       the paper's "bubble time
                                                                     fraction"
    bubble_fraction  idle / (p * makespan)    = (p-1) / (v m + p - 1)  the share of all
                                                                     stage-time spent idle

GPipe and 1F1B have the same bubble; 1F1B needs less memory. Interleaving divides the bubble
by v at the price of v times as many sends between stages.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab.distributed.schedule_rules import (
    ScheduleError,
    check_schedule,
    normalize_order,
    simulate_times,
)

__all__ = [
    "Action", "Schedule", "ScheduleError", "bubble_fraction_theory", "bubble_ratio_theory",
    "check_schedule", "gpipe_order", "interleaved_order", "one_f_one_b_order", "schedule_1f1b",
    "schedule_gpipe", "schedule_interleaved_1f1b", "simulate_schedule",
]

_CHUNK_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Action:
    """One timed piece of work on one stage (device)."""

    stage: int  # pipeline rank (device) 0..p-1
    kind: str  # "F" (forward) or "B" (backward)
    microbatch: int  # 0..m-1
    chunk: int  # model chunk on this device, 0..v-1 (always 0 unless interleaved)
    start: float
    end: float

    def label(self, n_chunks: int = 1) -> str:
        """The text label: F3, or F3b for chunk 1 when there are several chunks (a, b, c...)."""
        return f"{self.kind}{self.microbatch}" + (
            _CHUNK_LETTERS[self.chunk] if n_chunks > 1 else "")


@dataclass(frozen=True)
class Schedule:
    """A simulated schedule: every action with its start and end time."""

    name: str  # "GPipe", "1F1B", "interleaved 1F1B" or what the caller named it
    pp_size: int  # p: stages (devices)
    n_microbatches: int  # m
    n_chunks: int  # v: model chunks per device (1 unless interleaved)
    actions: tuple[Action, ...]  # ordered by stage, then start time

    def stage_actions(self, stage: int) -> list[Action]:
        return [a for a in self.actions if a.stage == stage]

    @property
    def makespan(self) -> float:
        """From time 0 to the last end: the time of one training step's pipeline."""
        return max(a.end for a in self.actions)

    @property
    def busy(self) -> list[float]:
        """Time each stage spends computing."""
        return [sum(a.end - a.start for a in self.stage_actions(s)) for s in range(self.pp_size)]

    @property
    def idle(self) -> list[float]:
        """Time each stage waits within the makespan."""
        return [self.makespan - b for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        """Idle time over all stage-time, p * makespan: (p-1)/(v m + p - 1) in theory."""
        return sum(self.idle) / (self.pp_size * self.makespan)

    @property
    def bubble_ratio(self) -> float:
        """Idle time over busy time: the Megatron-LM paper's t_pb / t_id = (p-1)/(v m)."""
        return sum(self.idle) / sum(self.busy)

    @property
    def peak_in_flight(self) -> list[int]:
        """Per stage, the most microbatches (microbatch-chunks when v > 1) whose forward has
        run and whose backward has not: how many sets of activations it must hold at once."""
        peaks = []
        for s in range(self.pp_size):
            held = peak = 0
            for a in self.stage_actions(s):
                held += 1 if a.kind == "F" else -1
                peak = max(peak, held)
            peaks.append(peak)
        return peaks

    def order(self) -> list[list[tuple]]:
        """The per-stage order of work that produced this schedule."""
        return [[(a.kind, a.microbatch) if self.n_chunks == 1 else
                 (a.kind, a.microbatch, a.chunk) for a in self.stage_actions(s)]
                for s in range(self.pp_size)]

    def text(self, unit: float | None = None) -> str:
        """One line per stage on a grid of `unit` time steps (default: the shortest action):
        each action's label fills its steps, idle steps are dots. Exact when every start and
        duration is a multiple of unit."""
        unit = unit or min(a.end - a.start for a in self.actions)
        width = max(len(a.label(self.n_chunks)) for a in self.actions) + 1
        steps = round(self.makespan / unit)
        lines = []
        for s in range(self.pp_size):
            cells = [".".ljust(width)] * steps
            for a in self.stage_actions(s):
                first, last = round(a.start / unit), round(a.end / unit)
                # The label spans the action's steps; its other cells print as nothing.
                cells[first:last] = [a.label(self.n_chunks).ljust(width * (last - first))] + [
                    ""] * (last - first - 1)
            lines.append(f"stage {s}: " + "".join(cells).rstrip())
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: name, sizes, makespan, bubble against theory, peak activations."""
        theory = bubble_fraction_theory(self.pp_size, self.n_microbatches, self.n_chunks)
        return (f"{self.name}: p={self.pp_size}, m={self.n_microbatches}"
                + (f", v={self.n_chunks}" if self.n_chunks > 1 else "")
                + f": makespan {self.makespan:g}, bubble {self.bubble_fraction:.1%} of stage-time"
                f" (uniform-cost theory {theory:.1%}), peak in flight {self.peak_in_flight}")


def bubble_fraction_theory(pp_size: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """(p-1) / (v m + p - 1): idle share of all stage-time, uniform costs, no comm latency."""
    return (pp_size - 1) / (n_chunks * n_microbatches + pp_size - 1)


def bubble_ratio_theory(pp_size: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """(p-1) / (v m): bubble time over ideal time (Narayanan et al. 2021, Sec. 2.2.1-2.2.2)."""
    return (pp_size - 1) / (n_chunks * n_microbatches)


def gpipe_order(pp_size: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """Every stage: F0 .. F(m-1), then B0 .. B(m-1)."""
    _check_sizes(pp_size, n_microbatches)
    one = [("F", i) for i in range(n_microbatches)] + [("B", i) for i in range(n_microbatches)]
    return [list(one) for _ in range(pp_size)]


def one_f_one_b_order(pp_size: int, n_microbatches: int) -> list[list[tuple[str, int]]]:
    """1F1B (PipeDream-Flush, Megatron's non-interleaved schedule), per stage s: warm up with
    w = min(p - s - 1, m) forwards, then alternate one forward and one backward, then the
    remaining w backwards. The last stage starts a backward as soon as a forward ends."""
    _check_sizes(pp_size, n_microbatches)
    orders = []
    for s in range(pp_size):
        warmup = min(pp_size - s - 1, n_microbatches)
        order = [("F", i) for i in range(warmup)]
        for i in range(n_microbatches - warmup):  # steady state
            order += [("F", warmup + i), ("B", i)]
        order += [("B", i) for i in range(n_microbatches - warmup, n_microbatches)]
        orders.append(order)
    return orders


def interleaved_order(pp_size: int, n_microbatches: int,
                      n_chunks: int) -> list[list[tuple[str, int, int]]]:
    """Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving): device
    s holds chunks c = 0..v-1, virtual stages c * p + s. Its k-th forward runs chunk
    (k mod p v) // p on microbatch (k // p v) p + k mod p: p microbatches through chunk 0,
    the same p through chunk 1, ...; backwards likewise with the chunks reversed. Warm-up:
    min((p - s - 1) * 2 + (v - 1) * p, v m) forwards, then one forward, one backward. Like the
    paper (Sec. 2.2.2), it needs m to be a multiple of p."""
    _check_sizes(pp_size, n_microbatches, n_chunks)
    p, m, v = pp_size, n_microbatches, n_chunks
    if v < 2:
        raise ValueError(f"the interleaved schedule needs n_chunks >= 2 model chunks per "
                         f"device, got {v}; with one chunk it is one_f_one_b_order")
    if m % p:
        raise ValueError(f"the interleaved schedule needs n_microbatches to be a multiple of "
                         f"pp_size (it sends microbatches in groups of p): got m={m}, p={p}")

    def nth(k: int, kind: str) -> tuple[str, int, int]:
        in_group = k % (p * v)
        chunk = in_group // p if kind == "F" else v - 1 - in_group // p
        return (kind, k // (p * v) * p + in_group % p, chunk)

    orders = []
    for s in range(p):
        total = m * v
        warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
        order = [nth(k, "F") for k in range(warmup)]
        for i in range(total - warmup):
            order += [nth(warmup + i, "F"), nth(i, "B")]
        order += [nth(k, "B") for k in range(total - warmup, total)]
        orders.append(order)
    return orders


def simulate_schedule(order, pp_size: int, n_microbatches: int, n_chunks: int = 1, tf=1.0,
                      tb=None, comm: float = 0.0, name: str = "custom") -> Schedule:
    """Lay out `order` in time. tf, tb: a number or one per stage (tb defaults to 2 tf); comm:
    latency of each send between devices. Raises ScheduleError (a ValueError) when the order
    breaks a rule or deadlocks; see check_schedule for the rules."""
    _check_sizes(pp_size, n_microbatches, n_chunks)
    tf = _per_stage(tf, pp_size, "tf")
    tb = [2 * t for t in tf] if tb is None else _per_stage(tb, pp_size, "tb")
    if comm < 0:
        raise ValueError(f"comm must be >= 0, got {comm}")
    steps = normalize_order(order, pp_size, n_microbatches, n_chunks)
    cost = {"F": [t / n_chunks for t in tf], "B": [t / n_chunks for t in tb]}
    times = simulate_times(steps, pp_size, n_microbatches, n_chunks, cost, comm)
    timed = [Action(s, kind, mb, chunk, *times[s][k])
             for s in range(pp_size) for k, (kind, mb, chunk) in enumerate(steps[s])]
    return Schedule(name, pp_size, n_microbatches, n_chunks, tuple(timed))


def schedule_gpipe(pp_size: int, n_microbatches: int, tf=1.0, tb=None,
                   comm: float = 0.0) -> Schedule:
    order = gpipe_order(pp_size, n_microbatches)
    return simulate_schedule(order, pp_size, n_microbatches, 1, tf, tb, comm, "GPipe")


def schedule_1f1b(pp_size: int, n_microbatches: int, tf=1.0, tb=None,
                  comm: float = 0.0) -> Schedule:
    order = one_f_one_b_order(pp_size, n_microbatches)
    return simulate_schedule(order, pp_size, n_microbatches, 1, tf, tb, comm, "1F1B")


def schedule_interleaved_1f1b(pp_size: int, n_microbatches: int, n_chunks: int = 2, tf=1.0,
                              tb=None, comm: float = 0.0) -> Schedule:
    """tf and tb are per microbatch for a device's whole share of the model: each of its
    n_chunks chunks costs tf / n_chunks and tb / n_chunks."""
    order = interleaved_order(pp_size, n_microbatches, n_chunks)
    return simulate_schedule(order, pp_size, n_microbatches, n_chunks, tf, tb, comm,
                             "interleaved 1F1B")


def _per_stage(cost, pp_size: int, what: str) -> list[float]:
    costs = [float(cost)] * pp_size if isinstance(cost, (int, float)) else [float(c) for c in cost]
    if len(costs) != pp_size or any(c <= 0 for c in costs):
        raise ValueError(f"{what} must be a positive number or one positive number per stage "
                         f"({pp_size}), got {cost!r}")
    return costs


def _check_sizes(pp_size: int, n_microbatches: int, n_chunks: int = 1) -> None:
    for what, value in (("pp_size", pp_size), ("n_microbatches", n_microbatches),
                        ("n_chunks", n_chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an int >= 1, got {value!r}")
