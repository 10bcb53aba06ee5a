"""Lab 1, Part 5: a histogram with atomics (check_histogram, check_histogram_races).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.lab1.config import (
    GRID,
    HISTOGRAM_BINS,
    HISTOGRAM_WIDTH,
)
from gpulab.kernels.histogram import histogram_reference


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
            f"histogram ({case}, bin_width={HISTOGRAM_WIDTH}): counts[{v}] is {got[v]}, "
            f"expected {want[v]} (total {got.sum()}, expected {want.sum()}). {hint}")


def check_histogram_races(kernel, n=100, seed=0):
    """histogram under the race detector, with many values per bin so that threads collide."""
    require_own_kernel(kernel, "histogram")
    x = np.random.default_rng(seed).integers(0, 3 * HISTOGRAM_WIDTH, size=n, dtype=np.int32)
    counts = np.zeros(HISTOGRAM_BINS, dtype=np.int32)
    blocks, tpb = GRID
    check_races(kernel, "histogram", blocks, tpb, counts, x, np.int32(HISTOGRAM_WIDTH),
                case=f"n={n}")


