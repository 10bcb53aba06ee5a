"""Lab 1, Part 5: a histogram with atomics (check_histogram, check_histogram_races, and
check_histogram_technique: privatized in shared memory, a few global atomics per block).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.harness.technique import (
    Yardstick,
    atomics_per_block,
    judge_technique,
    trace_kernel,
)
from gpulab.checks.lab1.config import (
    GRID,
    HISTOGRAM_BINS,
    HISTOGRAM_WIDTH,
)
from gpulab.kernels.histogram import histogram_reference

HINT = 'gpulab.hint("lab1", "histogram")'


def _histogram_input(n, rng, skewed):
    """Values in [0, bins * width + width): most land in a bin, some past the last one."""
    top = HISTOGRAM_BINS * HISTOGRAM_WIDTH + HISTOGRAM_WIDTH
    if skewed:  # every value in bin 5: all the threads collide on one counter
        return np.full(n, 5 * HISTOGRAM_WIDTH + 1, dtype=np.int32)
    return rng.integers(0, top, size=n, dtype=np.int32)


def check_histogram(kernel, sizes=(1000, 4096), seed=0, skewed=False):
    """histogram(counts, x, bin_width): counts[v // bin_width] += 1 for each value v of x, values
    past the last bin ignored; launched on a fixed grid of GRID threads (grid-stride loop)."""
    require_own_kernel(kernel, "histogram")
    rng = np.random.default_rng(seed)
    blocks, tpb = GRID
    for n in sizes:
        x = _histogram_input(n, rng, skewed)
        case = f"n={n}{', every value in one bin' if skewed else ''}"
        counts = GuardedOutput((HISTOGRAM_BINS,), np.int32, 0)
        want = histogram_reference(x // HISTOGRAM_WIDTH, HISTOGRAM_BINS).astype(np.int64)
        launch(kernel, "histogram", blocks, tpb, counts.view, cuda.to_device(x),
               np.int32(HISTOGRAM_WIDTH), case=case)
        got = counts.result("histogram", case, dtype=np.int64)
        if np.array_equal(got, want):
            continue
        v = int(np.flatnonzero(got != want)[0])
        grid_threads = blocks * tpb
        head = histogram_reference(x[:grid_threads] // HISTOGRAM_WIDTH, HISTOGRAM_BINS)
        if n > grid_threads and np.array_equal(got, head):
            hint = (f"Only the first {grid_threads} values were counted (the grid's threads): "
                    "use a grid-stride loop as in Part 1.")
        elif np.array_equal(got, histogram_reference(x, HISTOGRAM_BINS)):
            hint = "Those are counts of the values themselves: the bin is v // bin_width."
        elif got.sum() < want.sum():
            hint = ("Counts were lost. When two threads add to the same bin at once, a plain "
                    "`counts[b] += 1` (read, add, write) loses one of them: use "
                    "cuda.atomic.add(counts, b, 1).")
        else:
            hint = ("Some values were counted more than once: each thread steps by "
                    "cuda.gridsize(1), so every value is visited exactly once.")
        raise AssertionError(
            f"{hint} (histogram, {case}, bin_width={HISTOGRAM_WIDTH}: counts[{v}] is {got[v]}, "
            f"expected {want[v]}; total {got.sum()}, expected {want.sum()}. More: {HINT}.)")


def check_histogram_races(kernel, n=100, seed=0):
    """histogram under the race detector, with many values per bin so that threads collide."""
    require_own_kernel(kernel, "histogram")
    x = np.random.default_rng(seed).integers(0, 3 * HISTOGRAM_WIDTH, size=n, dtype=np.int32)
    counts = np.zeros(HISTOGRAM_BINS, dtype=np.int32)
    blocks, tpb = GRID
    check_races(kernel, "histogram", blocks, tpb, counts, x, np.int32(HISTOGRAM_WIDTH),
                case=f"n={n}")




# ----------------------------------------------------------------------------- technique

TECHNIQUE_SIZE = 512  # values: 8 per thread of the cpu runner's grid
SPEED_SIZE = 1 << 22  # the gpu runner's timing, values in one bin: printed, not graded


@cuda.jit
def _global_histogram(counts, x, bin_width):
    """What the gpu runner times histogram against: one global atomic add per value."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = x[i] // bin_width
        if b < counts.size:
            cuda.atomic.add(counts, b, 1)


def check_histogram_technique(kernel, n=TECHNIQUE_SIZE, seed=0):
    """A privatized histogram, judged on the simulator's trace on both runners
    (technique_verdict); the gpu runner prints the measured speed beside it."""
    require_own_kernel(kernel, "histogram")
    judge_technique(technique_verdict, kernel, {"n": n, "seed": seed}, _yardstick)


def technique_verdict(kernel, n=TECHNIQUE_SIZE, seed=0):
    """Each block adds to the global counts at most once per bin."""
    blocks, tpb = GRID  # the cpu runner's: a verdict always runs on the simulator
    x = _histogram_input(n, np.random.default_rng(seed), skewed=False)
    case = f"n={n}, {blocks} blocks of {tpb} threads"
    trace = trace_kernel(kernel, "histogram", blocks, tpb, np.zeros(HISTOGRAM_BINS, np.int32),
                         x, np.int32(HISTOGRAM_WIDTH), case=case)
    per_block = atomics_per_block(trace, "global")
    block, most = max(per_block.items(), key=lambda item: item[1], default=(0, 0))
    if most > HISTOGRAM_BINS:
        raise AssertionError(
            f"Count into a shared-memory copy of the bins, then add each bin to counts once: "
            f"histogram ({case}) made {sum(per_block.values())} global atomic adds for {n} "
            f"values, {most} of them in block {block}, where a privatized histogram makes at "
            f"most {HISTOGRAM_BINS} per block. The values are right; this is the technique's "
            f"part. More: {HINT}.")


def _yardstick() -> Yardstick:
    x = _histogram_input(SPEED_SIZE, np.random.default_rng(0), skewed=True)
    blocks, tpb = GRID

    def make_args():
        return (cuda.to_device(np.zeros(HISTOGRAM_BINS, np.int32)), cuda.to_device(x),
                np.int32(HISTOGRAM_WIDTH))

    return Yardstick(_global_histogram, "one global atomic add per value",
                     f"n={SPEED_SIZE}, every value in one bin", blocks, tpb, make_args)
