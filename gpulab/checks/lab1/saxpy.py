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
    first_grid_only,
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
        grid_threads = blocks * tpb
        if first_grid_only(got, want, grid_threads):
            hint = (f"Only out[0:{grid_threads}] was written: the grid has {blocks} blocks x "
                    f"{tpb} threads = {grid_threads} threads for {n} elements. Loop: start at "
                    "i = cuda.grid(1) and step by cuda.gridsize(1) while i < n.")
        elif np.isnan(got[i]):
            hint = ("This element was never written. Each thread must visit i, i + stride, "
                    "i + 2 * stride, ... while i < n, with stride = cuda.gridsize(1) (all the "
                    "threads of the grid).")
        elif np.isclose(got[i], np.float64(a) * y[i] + x[i], rtol=1e-5, atol=1e-5):
            hint = "That is a * y + x: x and y are swapped."
        else:
            hint = "Check the formula: out[i] = a * x[i] + y[i]."
        raise AssertionError(
            f"saxpy ({case}, a={a:.4f}): out[{i}] is {got[i]:.5f}, expected {want[i]:.5f} "
            f"(x[{i}]={x[i]:.5f}, y[{i}]={y[i]:.5f}). {len(bad)} of {n} elements are wrong. "
            f"{hint}")


