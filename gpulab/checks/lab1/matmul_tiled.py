"""Lab 1, Part 4: tiled matmul with a bias epilogue, two outputs per thread (check_matmul_tiled,
check_matmul_tiled_races, and check_matmul_tiled_technique: the tiles come from shared memory).

A block of (TILE, TILE // 2) threads computes a TILE x TILE tile of c: every thread computes
OUTPUTS_PER_THREAD elements of c, so each value it reads from a shared tile serves more than one
output (register tiling, the step after lesson 02's matmul_kernel_v2, which computes one output
per thread on (TILE, TILE) blocks: retyped, it leaves half of c unwritten).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.harness.technique import Yardstick, judge_technique, trace_kernel
from gpulab.checks.lab1.config import OUTPUTS_PER_THREAD, TILE
from gpulab.kernels.common import ceil_div

THREADS = (TILE, TILE // OUTPUTS_PER_THREAD)  # (x, y): a block computes a TILE x TILE tile of c
HINT = 'gpulab.hint("lab1", "matmul_tiled")'


def _matmul_inputs(shape, rng):
    m, k, n = shape
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return a, b, bias, (ceil_div(n, TILE), ceil_div(m, TILE))


def check_matmul_tiled(kernel, shapes=((8, 16, 8), (13, 21, 10)), seed=0):
    """matmul_tiled(c, a, b, bias): c = a @ b + bias for (M, K) @ (K, N), bias of length N;
    blocks of THREADS = (TILE, TILE // 2) threads, one per TILE x TILE tile of c, x along c's
    columns, y along its rows."""
    require_own_kernel(kernel, "matmul_tiled")
    rng = np.random.default_rng(seed)
    for m, k, n in shapes:
        a, b, bias, blocks = _matmul_inputs((m, k, n), rng)
        case = f"a ({m}, {k}) @ b ({k}, {n}), TILE={TILE}"
        c = GuardedOutput((m, n), np.float32, np.nan)
        product = a.astype(np.float64) @ b.astype(np.float64)
        want = product + bias
        launch(kernel, "matmul_tiled", blocks, THREADS, c.view, cuda.to_device(a),
               cuda.to_device(b), cuda.to_device(bias), case=case)
        got = c.result("matmul_tiled", case)
        bad = bad_indices(got, want, rtol=1e-3, atol=1e-3)
        if bad.size == 0:
            continue
        i, j = (int(v) for v in bad[0])
        n_tiles = ceil_div(k, TILE)
        # Rows and columns of c in a partial tile (the last one, when M or N is not a multiple).
        edge_row, edge_col = bad[:, 0] >= m // TILE * TILE, bad[:, 1] >= n // TILE * TILE
        unwritten_rows = int(np.isnan(got).all(axis=1).sum())
        if m >= TILE and unwritten_rows >= m // 2:
            hint = (f"{unwritten_rows} of c's {m} rows were never written: a block has "
                    f"{THREADS[1]} rows of threads for a tile of {TILE} rows of c, so each "
                    f"thread computes {OUTPUTS_PER_THREAD} outputs, and loads its share of "
                    "both shared tiles.")
        elif np.isnan(got[i, j]):
            hint = ("It was never written. Guard only the final stores against M and N: every "
                    "thread must reach every cuda.syncthreads(), so none may return early.")
        elif np.allclose(got, product, rtol=1e-3, atol=1e-3):
            hint = "That is a @ b without the bias: add bias[col] to each output."
        elif n_tiles > 1 and np.allclose(got, product + n_tiles * bias, rtol=1e-3, atol=1e-3):
            hint = "The bias was added once per tile: add it once, after the loop over tiles."
        elif (edge_row | edge_col).all():
            hint = ("Only the edge tiles are wrong: where a tile sticks out of a or b, its "
                    "threads must still load, 0.0 outside the matrices, so that no thread "
                    "returns early and the padding adds nothing.")
        else:
            hint = ("Check which tiles each step along K loads: step t stages the t-th TILE-wide "
                    "slice of a's rows and of b's columns, and each output adds TILE products "
                    "of a row of a's tile and a column of b's. Both cuda.syncthreads() are "
                    "needed: after loading, and before the next step overwrites the tiles.")
        raise AssertionError(
            f"{hint} (matmul_tiled, {case}: c[{i}, {j}] is {got[i, j]:.4f}, expected "
            f"{want[i, j]:.4f}; {len(bad)} of {got.size} elements are wrong. More: {HINT}.)")


def check_matmul_tiled_races(kernel, shape=(TILE + 1, TILE + 4, TILE + 2), seed=0):
    """matmul_tiled under the race detector: 2 x 2 blocks, two steps along K."""
    require_own_kernel(kernel, "matmul_tiled")
    a, b, bias, blocks = _matmul_inputs(shape, np.random.default_rng(seed))
    c = np.zeros((shape[0], shape[2]), dtype=np.float32)
    check_races(kernel, "matmul_tiled", blocks, THREADS, c, a, b, bias,
                case=f"a {a.shape} @ b {b.shape}")




# ----------------------------------------------------------------------------- technique

TECHNIQUE_SHAPE = (16, 24, 16)  # (M, K, N): 2 x 2 blocks, 3 tiles along K; traced in seconds
TILED_SLACK = 1.25  # edge tiles and guards may add a little to the formula's bytes
SPEED_SHAPE = (1024, 1024, 1024)  # the gpu runner's timing, printed and not graded


def tiled_read_bytes(m: int, k: int, n: int, tile: int = TILE, itemsize: int = 4) -> dict:
    """Global bytes a tiled matmul reads of each operand: every block loads each tile once, so
    a is read once per column of blocks and b once per row of blocks."""
    return {"a": m * k * ceil_div(n, tile) * itemsize, "b": k * n * ceil_div(m, tile) * itemsize}


@cuda.jit
def _plain_matmul(c, a, b, bias):
    """What the gpu runner times matmul_tiled against: one thread per element of c, operands
    from global memory."""
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        total = 0.0
        for k in range(a.shape[1]):
            total += a[row, k] * b[k, col]
        c[row, col] = total + bias[col]


def check_matmul_tiled_technique(kernel, shape=TECHNIQUE_SHAPE, seed=0):
    """The tiles are staged in shared memory, judged on the simulator's trace on both runners
    (technique_verdict); the gpu runner prints the measured speed beside it."""
    require_own_kernel(kernel, "matmul_tiled")
    judge_technique(technique_verdict, kernel, {"shape": tuple(shape), "seed": seed},
                    lambda: _yardstick(seed))


def technique_verdict(kernel, shape=TECHNIQUE_SHAPE, seed=0):
    """Global bytes read of a and of b within TILED_SLACK of tiled_read_bytes."""
    m, k, n = shape
    a, b, bias, blocks = _matmul_inputs(shape, np.random.default_rng(seed))
    case = f"a ({m}, {k}) @ b ({k}, {n}), TILE={TILE}"
    trace = trace_kernel(kernel, "matmul_tiled", blocks, THREADS,
                         np.zeros((m, n), np.float32), a, b, bias, case=case)
    want = tiled_read_bytes(m, k, n)
    for name, line in (("a", "row"), ("b", "column")):
        got = trace.bytes_read_by_array.get(name, 0)
        if got > TILED_SLACK * want[name]:
            raise AssertionError(
                f"Stage each TILE x TILE tile of `{name}` in shared memory and read it from "
                f"there: matmul_tiled ({case}) reads {got / want[name]:.1f}x the global bytes of "
                f"`{name}` that a TILE={TILE} tiled matmul reads ({got} B against {want[name]} "
                f"B), so every thread reads a whole {line} of `{name}` from global memory. The "
                f"values are right; this is the technique's part. More: {HINT}.")


def _yardstick(seed: int) -> Yardstick:
    m, k, n = SPEED_SHAPE
    a, b, bias, blocks = _matmul_inputs(SPEED_SHAPE, np.random.default_rng(seed))

    def make_args():
        return (cuda.device_array((m, n), np.float32), cuda.to_device(a), cuda.to_device(b),
                cuda.to_device(bias))

    return Yardstick(_plain_matmul, "a plain matmul (every operand from global memory)",
                     f"{m} x {k} x {n}", blocks, THREADS, make_args,
                     ref_threads_per_block=(TILE, TILE))
