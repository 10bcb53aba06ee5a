"""Lab 1, Part 2: transpose with 2-D indexing (check_transpose).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.lab1.config import (
    TRANSPOSE_THREADS,
)
from gpulab.kernels.common import ceil_div


def check_transpose(kernel, shapes=((8, 24), (13, 21)), seed=0):
    """transpose(out, a): out[c, r] = a[r, c] for a of shape (R, C), one thread per element;
    threads_per_block = TRANSPOSE_THREADS with x along a's columns, y along its rows."""
    require_own_kernel(kernel, "transpose")
    rng = np.random.default_rng(seed)
    tx, ty = TRANSPOSE_THREADS
    for rows, cols in shapes:
        a = rng.standard_normal((rows, cols)).astype(np.float32)
        case = f"a of shape ({rows}, {cols}), out of shape ({cols}, {rows})"
        blocks = (ceil_div(cols, tx), ceil_div(rows, ty))
        out = GuardedOutput((cols, rows), np.float32, np.nan)
        want = a.T.astype(np.float64)
        launch(kernel, "transpose", blocks, (tx, ty), out.view, cuda.to_device(a), case=case)
        got = out.result("transpose", case)
        bad = bad_indices(got, want, rtol=0, atol=0)
        if bad.size == 0:
            continue
        c, r = (int(v) for v in bad[0])
        if np.isnan(got[c, r]):
            hint = ("It was never written. The grid covers a: x runs along a's columns and y "
                    "along its rows, so `col, row = cuda.grid(2)` (x first), then guard "
                    "`row < a.shape[0] and col < a.shape[1]`.")
        elif rows * cols > 1 and np.array_equal(got, a.reshape(cols, rows)):
            hint = ("out holds a's elements in a's own order (a reshape, not a transpose): "
                    "write a[row, col] to out[col, row].")
        else:
            hint = "Write a[row, col] to out[col, row]: the row of a becomes the column of out."
        raise AssertionError(
            f"transpose ({case}): out[{c}, {r}] is {got[c, r]:.5f}, expected a[{r}, {c}] = "
            f"{want[c, r]:.5f}. {len(bad)} of {got.size} elements are wrong. {hint}")


