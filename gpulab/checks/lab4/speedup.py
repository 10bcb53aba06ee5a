"""Checker for Lab 4, Part B4: fast_train at least 3x as fast as slow_train, with the same
results (solutions/lab4_memory_and_profiling/lab4_memory_and_profiling.ipynb).

    check_speedup(fast_train)         the same results (fast_results.check_fast_results), then
                                      the speed-up, as a ratio measured here, in one run

The speed is a ratio of times measured in the same process, the two sides taking turns round by
round (slow, fast, then fast, slow, ...), each round on a fresh problem with its own seed; the
ratio is the best slow time over the best fast time. On a GPU the time is wall time, and every
timed run ends with torch.cuda.synchronize(), so it counts the device's work. On a CPU it is
the CPU time of this process and of its child processes that have exited (DataLoader workers
are joined when their loader is done): the work itself, which other processes competing for the
cores cannot inflate. Wall time on a busy machine is time-sliced, and a short fast run can slip
between two slices that a long slow run cannot, which skews a wall-time ratio either way.
Taught in: Lab 4 (and lessons/08_profiling_and_optimization.ipynb)
"""

from __future__ import annotations

import functools
import time

import torch
from torch.overrides import TorchFunctionMode

from gpulab.checks.harness.training import call_learner, one_thread
from gpulab.checks.lab4.fast_results import as_losses, check_fast_results, full_fp32, losses_close
from gpulab.slow_pipeline import pipeline_problem, slow_train

TIMED_STEPS, ROUNDS = 30, 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its children that have exited."""
    own = time.process_time()
    try:
        import resource  # Unix only
    except ImportError:
        return own
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + children.ru_utime + children.ru_stime


def _clock(device: torch.device):
    """What the speed is measured with on `device` (see the module's docstring)."""
    return time.perf_counter if device.type == "cuda" else _cpu_seconds


def _timed(train, problem, case: str) -> tuple[float, object]:
    """Seconds for one call of train on a fresh model: wall time including the device's work on
    a GPU, CPU time on a CPU."""
    model = problem.new_model()
    optimizer = problem.new_optimizer(model)
    images, labels = problem.images.clone(), problem.labels.clone()
    call = functools.partial(train, steps=problem.steps, batch_size=problem.batch_size,
                             seed=problem.seed)
    clock = _clock(problem.device)
    _sync(problem.device)  # nothing queued before may land in this run's time
    start = clock()
    value = call_learner(call, "fast_train", model, optimizer, images, labels, case=case)
    _sync(problem.device)
    return clock() - start, value


class _Census(TorchFunctionMode):
    """Counts what a run does: torch calls, model calls, values read back into Python, and
    tensors built from Python data. Used only to explain a slow result, never timed."""

    READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")

    def __init__(self):
        super().__init__()
        self.calls, self.reads, self.from_python, self.model_calls = 0, 0, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        self.calls += 1
        self.reads += name in self.READS
        self.from_python += name in ("tensor", "as_tensor")
        return func(*args, **(kwargs or {}))


MODEL_CALLS = "model calls"
READS = "values read into Python (.item(), .tolist(), .cpu(), float(), ...)"
BUILT = "tensors built from Python data (torch.tensor)"
CALLS = "torch functions called"
PER_EXAMPLE_CALLS = 4  # torch calls a step per example beyond which the work is per example
# (a right fast_train makes about 50 a step for 64 examples; slow_train about 1,600)


def _census(train, problem, steps: int) -> dict[str, float]:
    model = problem.new_model()
    optimizer = problem.new_optimizer(model)
    census = _Census()
    hook = model.register_forward_pre_hook(lambda *_: setattr(
        census, "model_calls", census.model_calls + 1))
    try:
        with census:
            train(model, optimizer, problem.images.clone(), problem.labels.clone(), steps=steps,
                  batch_size=problem.batch_size, seed=problem.seed)
    finally:
        hook.remove()
    return {MODEL_CALLS: census.model_calls / steps, READS: census.reads / steps,
            BUILT: census.from_python / steps, CALLS: census.calls / steps}


def what_is_left(theirs: dict[str, float], ours: dict[str, float], batch_size: int) -> str:
    """The slowness fast_train kept, named from its census per step (theirs) beside
    slow_train's (ours), the costliest on a CPU first."""
    if theirs[BUILT] >= 1:
        return (f"It still builds its inputs from Python values, {theirs[BUILT]:.0f} tensors a "
                f"step (slow_train {ours[BUILT]:.0f}): the transform runs per example, in Python, "
                "on every step.")
    if theirs[CALLS] > PER_EXAMPLE_CALLS * batch_size:
        return (f"It still works example by example: {theirs[CALLS]:.0f} torch calls a step for "
                f"{batch_size} examples (slow_train {ours[CALLS]:.0f}). Work that is the same for "
                "every example can be done for all of them at once, and once per run.")
    if theirs[MODEL_CALLS] > 1:
        return (f"It runs the model {theirs[MODEL_CALLS]:.0f} times a step (slow_train "
                f"{ours[MODEL_CALLS]:.0f}): micro-batches, each a pass of its own.")
    if theirs[READS] >= 1:
        return (f"It reads {theirs[READS]:.1f} values a step back into Python (slow_train "
                f"{ours[READS]:.0f}): each read is a pause, and on a GPU a wait.")
    return "Nothing it does per step stands out in the counts below: profile it."


def _slow_message(ratio: float, min_speedup: float, slow_s: float, fast_s: float,
                  fast_train, problem, rounds: int) -> str:
    steps = 10
    ours, theirs = _census(slow_train, problem, steps), _census(fast_train, problem, steps)
    rows = "\n".join(f"  {what:<68}{theirs[what]:>8.1f}{ours[what]:>8.1f}" for what in ours)
    per = problem.steps
    what = "wall" if problem.device.type == "cuda" else "CPU"
    return (
        f"fast_train is {ratio:.2f}x as fast as slow_train; it must be at least "
        f"{min_speedup:g}x. {what_is_left(theirs, ours, problem.batch_size)}\n"
        f"Best of {rounds} runs of {per} steps each ({what} time): "
        f"slow_train {slow_s / per * 1e3:.2f} ms a step, fast_train {fast_s / per * 1e3:.2f} "
        "ms.\n"
        f"What each did per step ({steps} steps, counted):\n"
        f"  {'':<68}{'yours':>8}{'slow':>8}\n{rows}\n"
        "Profile your fast_train as Part B profiled slow_train (profile_steps, with phase() "
        "labels) and shrink the largest phase first: whatever is still done per example or "
        "per micro-batch costs Python overhead every step.")


@one_thread()
@full_fp32()
def check_speedup(fast_train, min_speedup: float = 3.0, seed: int = 0,
                  steps: int = TIMED_STEPS, rounds: int = ROUNDS) -> None:
    """check_fast_results first; then slow_train's time over fast_train's, measured here, must
    be at least `min_speedup`. The two take turns for `rounds` rounds (each round a new problem,
    seed + 1 + round, whose losses must agree too); the ratio is best time over best time."""
    check_fast_results(fast_train, seed=seed)  # a fast wrong answer earns nothing; warms up both
    slow_times, fast_times = [], []
    for r in range(rounds):
        problem = pipeline_problem(seed=seed + 1 + r, steps=steps)
        pair = (slow_train, fast_train) if r % 2 == 0 else (fast_train, slow_train)
        case = f"timed run, seed={problem.seed}, steps={steps}"
        timed = [_timed(train, problem, case) for train in pair]
        (slow_s, want), (fast_s, got) = timed if r % 2 == 0 else timed[::-1]
        got = as_losses(got, steps, problem.batch_size, case)
        bad = next((k for k, (g, w) in enumerate(zip(got, want, strict=True))
                    if not losses_close(g, w)), None)
        if bad is not None:
            raise AssertionError(
                f"fast_train ({case}): step {bad}'s loss is {got[bad]:.6f}, slow_train's "
                f"{want[bad]:.6f}. The results must agree on every run, not only the first: "
                "fast_train must compute each run from its arguments.")
        slow_times.append(slow_s)
        fast_times.append(fast_s)
    ratio = min(slow_times) / min(fast_times)
    if ratio < min_speedup:
        raise AssertionError(_slow_message(ratio, min_speedup, min(slow_times),
                                           min(fast_times), fast_train, problem, rounds))
