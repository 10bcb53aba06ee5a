"""Lab 1, Part 4: tiled matmul with a bias epilogue (check_matmul_tiled, check_matmul_tiled_races).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.lab1.config import (
    TILE,
)
from gpulab.kernels.common import ceil_div


def _matmul_inputs(shape, rng):
    m, k, n = shape
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return a, b, bias, (ceil_div(n, TILE), ceil_div(m, TILE))


def check_matmul_tiled(kernel, shapes=((8, 16, 8), (13, 21, 10)), seed=0):
    """matmul_tiled(c, a, b, bias): c = a @ b + bias for (M, K) @ (K, N), bias of length N;
    blocks of (TILE, TILE) threads, x along c's columns, y along its rows."""
    require_own_kernel(kernel, "matmul_tiled")
    rng = np.random.default_rng(seed)
    for m, k, n in shapes:
        a, b, bias, blocks = _matmul_inputs((m, k, n), rng)
        case = f"a ({m}, {k}) @ b ({k}, {n}), TILE={TILE}"
        c = GuardedOutput((m, n), np.float32, np.nan)
        product = a.astype(np.float64) @ b.astype(np.float64)
        want = product + bias
        launch(kernel, "matmul_tiled", blocks, (TILE, TILE), c.view, cuda.to_device(a),
               cuda.to_device(b), cuda.to_device(bias), case=case)
        got = c.result("matmul_tiled", case)
        bad = bad_indices(got, want, rtol=1e-3, atol=1e-3)
        if bad.size == 0:
            continue
        i, j = (int(v) for v in bad[0])
        n_tiles = ceil_div(k, TILE)
        # Rows and columns of c in a partial tile (the last one, when M or N is not a multiple).
        edge_row, edge_col = bad[:, 0] >= m // TILE * TILE, bad[:, 1] >= n // TILE * TILE
        if np.isnan(got[i, j]):
            hint = ("It was never written. `col, row = cuda.grid(2)` (x first); guard only the "
                    "final store with `row < M and col < N`: every thread must reach every "
                    "cuda.syncthreads(), so none may return early.")
        elif np.allclose(got, product, rtol=1e-3, atol=1e-3):
            hint = "That is a @ b without the bias: add bias[col] to the sum."
        elif n_tiles > 1 and np.allclose(got, product + n_tiles * bias, rtol=1e-3, atol=1e-3):
            hint = "The bias was added once per tile: add it once, after the loop over tiles."
        elif (edge_row | edge_col).all():
            hint = ("Only the edge tiles are wrong: where a tile sticks out of a or b, its "
                    "threads must still load, 0.0 outside the matrices (a[row, k] only if "
                    "row < M and k < K; b[k, col] only if k < K and col < N), so no thread "
                    "may return early and the padding adds nothing.")
        else:
            hint = ("Check the tile index: step t loads a[row, t * TILE + tx] and "
                    "b[t * TILE + ty, col], and the inner loop adds a_tile[ty, j] * b_tile[j, tx] "
                    "for j in range(TILE). Both cuda.syncthreads() are needed: after loading, "
                    "and before the next step overwrites the tiles.")
        raise AssertionError(
            f"matmul_tiled ({case}): c[{i}, {j}] is {got[i, j]:.4f}, expected {want[i, j]:.4f}. "
            f"{len(bad)} of {got.size} elements are wrong. {hint}")


def check_matmul_tiled_races(kernel, shape=(TILE + 1, TILE + 4, TILE + 2), seed=0):
    """matmul_tiled under the race detector: 2 x 2 blocks, two steps along K."""
    require_own_kernel(kernel, "matmul_tiled")
    a, b, bias, blocks = _matmul_inputs(shape, np.random.default_rng(seed))
    c = np.zeros((shape[0], shape[2]), dtype=np.float32)
    check_races(kernel, "matmul_tiled", blocks, (TILE, TILE), c, a, b, bias,
                case=f"a {a.shape} @ b {b.shape}")


