"""Lab 1, Part 1: SAXPY with a grid-stride loop (check_saxpy).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.lab1.config import (
    GRID,
)
from gpulab.kernels.vector_add import saxpy_reference


def check_saxpy(kernel, sizes=(2048, 5000), seed=0):
    """saxpy(out, a, x, y): out = a * x + y, launched on a fixed grid of GRID threads."""
    require_own_kernel(kernel, "saxpy")
    rng = np.random.default_rng(seed)
    blocks, tpb = GRID
    for n in sizes:
        a = np.float32(rng.uniform(0.5, 3.0))
        x = rng.standard_normal(n).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        case = f"n={n}"
        out = GuardedOutput((n,), np.float32, np.nan)
        want = saxpy_reference(a, x, y).astype(np.float64)
        launch(kernel, "saxpy", blocks, tpb, out.view, a, cuda.to_device(x), cuda.to_device(y),
               case=case)
        got = out.result("saxpy", case)
        bad = bad_indices(got, want, rtol=1e-5, atol=1e-5)
        if bad.size == 0:
            continue
        i = int(bad[0, 0])
        where = f"saxpy, {case}, a={a:.4f}, {blocks} blocks x {tpb} threads"
        if np.isnan(got[i]):  # the hint names the elements never written
            raise AssertionError(f"{_coverage_hint(got, want, blocks, tpb)} ({where}; "
                                 f"{len(bad)} of {n} elements are wrong.)")
        if np.isclose(got[i], np.float64(a) * y[i] + x[i], rtol=1e-5, atol=1e-5):
            hint = "out[i] is a * y[i] + x[i]: x and y are swapped."
        else:
            hint = "Check the formula: out[i] = a * x[i] + y[i]."
        raise AssertionError(
            f"{hint} ({where}: out[{i}] is {got[i]:.5f}, expected {want[i]:.5f} from "
            f"x[{i}]={x[i]:.5f}, y[{i}]={y[i]:.5f}; {len(bad)} of {n} elements are wrong.)")


def _coverage_hint(got, want, blocks: int, tpb: int) -> str:
    """Name the indexing mistake from which elements came out right and which were never
    written (NaN): a grid-stride loop from cuda.grid(1) leaves runs of `run` right elements
    repeating every `stride`, and which of `run` and `stride` is off says what went wrong."""
    n, grid_threads = got.shape[0], blocks * tpb
    if np.isnan(got).all():
        return ("No element of out was written: each thread must write out[i] for "
                "i = cuda.grid(1), i + cuda.gridsize(1), ... while i < n.")
    right = np.isclose(got, want, rtol=1e-5, atol=1e-5)
    run = int(np.argmin(right))  # out[0:run] right; out[run] never written
    later = np.flatnonzero(~np.isnan(got[run:]))
    stride = run + int(later[0]) if later.size else None  # where the next run starts
    index = np.arange(n)
    pattern = index < run if stride is None else index % stride < run
    if not (np.array_equal(right, pattern) and np.array_equal(np.isnan(got), ~pattern)):
        return (f"out[{run}] was never written ({int(np.isnan(got).sum())} of {n} elements "
                "were not). Each thread must write i = cuda.grid(1), i + cuda.gridsize(1), "
                "i + 2 * cuda.gridsize(1), ... while i < n.")
    runs = (f"out[0:{run}] was" if stride is None
            else f"out[0:{run}], out[{stride}:{stride + run}], ... were")
    if run == grid_threads and stride is None:
        return (f"Only out[0:{run}] was written: the grid has {blocks} blocks x {tpb} threads "
                f"= {grid_threads} threads for {n} elements, one element each. Loop: start at "
                "i = cuda.grid(1) and step by cuda.gridsize(1) while i < n.")
    if run == grid_threads:
        return (f"out[{run}:{stride}] was never written: each thread stepped by {stride}, not "
                f"by the grid's {grid_threads} threads. Step by cuda.gridsize(1).")
    if run == tpb:  # every block started at element 0: the start index left out the block
        stride_fix = "" if stride == grid_threads else ", and step by cuda.gridsize(1)"
        return (f"Only {runs} written: all {blocks} blocks wrote the same {tpb} elements. Start "
                "at i = cuda.grid(1) (blockIdx.x * blockDim.x + threadIdx.x), not "
                f"cuda.threadIdx.x{stride_fix}.")
    if stride is None:
        return (f"Only out[0:{run}] of {n} elements was written: the loop stopped early. Keep "
                "going while i < n (n = out.size).")
    return (f"Only {runs} written: each thread must write i = cuda.grid(1), "
            "i + cuda.gridsize(1), ... while i < n.")
