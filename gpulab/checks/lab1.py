"""Checkers for Lab 1, CUDA kernels (solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb).

Each checker launches the learner's kernel itself on inputs it makes, compares plain NumPy copies
of the results with a NumPy reference, and fails with a message that says which element, what
came out against what was expected, and the likely cause.

    check_saxpy(saxpy, sizes)                     Part 1  grid-stride loop
    check_transpose(transpose, shapes)            Part 2  2-D indexing
    check_block_sum(block_sum, sizes)             Part 3  shared-memory tree reduction
    check_matmul_tiled(matmul_tiled, shapes)      Part 4  tiled matmul with a bias epilogue
    check_histogram(histogram, sizes)             Part 5  atomics
    check_waves(n_waves, tail_utilization, ...)   Part 6  waves and the tail effect
    check_*_races(kernel)                         Parts 3-5 under gpulab.sim's race detector

Launch configurations are part of each part's spec (the notebook states them); sizes and grids
that differ between the cpu and gpu runners come from gpulab.runner.
Taught in: lessons/02_cuda_with_numba.ipynb (Parts 1-5), lessons/01_gpu_architecture.ipynb (6)
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import gpulab
from gpulab.checks.common import (
    GuardedOutput,
    as_number,
    bad_indices,
    check_races,
    launch,
    require_own_kernel,
)
from gpulab.hardware import get_gpu, waves
from gpulab.kernels.common import ceil_div
from gpulab.kernels.histogram import histogram_reference
from gpulab.kernels.vector_add import saxpy_reference

# (blocks, threads_per_block) of the grid-stride parts: a fixed grid, smaller than the arrays.
GRID = gpulab.runner.pick(cpu=(2, 32), gpu=(8, 128))
TRANSPOSE_THREADS = gpulab.runner.pick(cpu=(8, 8), gpu=(16, 16))  # (x, y) threads per block
BLOCK_SUM_THREADS = 64  # the notebook's THREADS: block_sum's shared array has this many cells
TILE = 8  # the notebook's TILE: matmul_tiled runs (TILE, TILE) blocks with TILE x TILE tiles
HISTOGRAM_BINS, HISTOGRAM_WIDTH = 16, 4  # Part 5: counts.size and bin_width


def _first_grid_only(got, want, grid_threads: int) -> bool:
    """Elements [0, grid) right and the rest never written: the grid-stride loop is missing."""
    n = got.shape[0]
    head_ok = np.allclose(got[:grid_threads], want[:grid_threads], rtol=1e-4, atol=1e-4)
    return n > grid_threads and head_ok and bool(np.isnan(got[grid_threads:]).all())


# ----------------------------------------------------------------------------- Part 1


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
        launch(kernel, "saxpy", blocks, tpb, out.view, a, cuda.to_device(x), cuda.to_device(y),
               case=case)
        got = out.result("saxpy", case)
        want = saxpy_reference(a, x, y).astype(np.float64)
        bad = bad_indices(got, want, rtol=1e-5, atol=1e-5)
        if bad.size == 0:
            continue
        i = int(bad[0, 0])
        grid_threads = blocks * tpb
        if _first_grid_only(got, want, grid_threads):
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


# ----------------------------------------------------------------------------- Part 2


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
        launch(kernel, "transpose", blocks, (tx, ty), out.view, cuda.to_device(a), case=case)
        got = out.result("transpose", case)
        want = a.T.astype(np.float64)
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


# ----------------------------------------------------------------------------- Part 3


def check_block_sum(kernel, sizes=(256, 1000), seed=0):
    """block_sum(out, x): out[b] = the sum of block b's BLOCK_SUM_THREADS elements of x."""
    require_own_kernel(kernel, "block_sum")
    rng = np.random.default_rng(seed)
    tpb = BLOCK_SUM_THREADS
    for n in sizes:
        x = rng.standard_normal(n).astype(np.float32)
        blocks = ceil_div(n, tpb)
        case = f"n={n}, {blocks} block(s) of {tpb} threads"
        out = GuardedOutput((blocks,), np.float32, np.nan)
        launch(kernel, "block_sum", blocks, tpb, out.view, cuda.to_device(x), case=case)
        got = out.result("block_sum", case)
        want = np.add.reduceat(x.astype(np.float64), np.arange(0, n, tpb))
        bad = bad_indices(got, want, rtol=1e-4, atol=1e-4)
        if bad.size == 0:
            continue
        b = int(bad[0, 0])
        first = x[b * tpb]
        if np.isnan(got[b]):
            hint = ("It was never written: after the tree, thread 0 of each block writes the "
                    "block's sum to out[cuda.blockIdx.x]. (out starts as NaN here, so adding "
                    "into it, atomically or not, leaves NaN: write, do not add.)")
        elif blocks > 1 and np.isclose(got[0], want.sum(), rtol=1e-4, atol=1e-4):
            hint = "out[0] holds the whole array's sum: write one sum per block instead."
        elif n % tpb and bad[:, 0].tolist() == [blocks - 1]:
            hint = ("Only the last, partial block is wrong: threads past the end of x must put "
                    "0.0 in shared memory (`x[i] if i < x.size else 0.0`) and still take part in "
                    "every cuda.syncthreads().")
        elif np.isclose(got[b], first, rtol=1e-6, atol=1e-6):
            hint = ("It equals the block's first element: thread 0 added nothing in. Either "
                    "the halving loop never ran (threads t < stride add cache[t + stride] into "
                    "cache[t], then stride //= 2, until stride is 0), or thread 0 read the "
                    "other cells before their threads wrote them: cuda.syncthreads() after "
                    "loading and after every step.")
        else:
            hint = ("Check the tree: stride starts at THREADS // 2 and halves each step; threads "
                    "t < stride add cache[t + stride] into cache[t]; cuda.syncthreads() after "
                    "loading and after every step, outside the `if`. A missing barrier can "
                    "give different answers from run to run.")
        raise AssertionError(
            f"block_sum ({case}): out[{b}] is {got[b]:.5f}, expected {want[b]:.5f} (the sum of "
            f"x[{b * tpb}:{min(n, (b + 1) * tpb)}]). {len(bad)} of {blocks} blocks are wrong. "
            f"{hint}")


def check_block_sum_races(kernel, n=2 * BLOCK_SUM_THREADS - 5, seed=0):
    """block_sum under the race detector: two blocks, the last one partial."""
    require_own_kernel(kernel, "block_sum")
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    blocks = ceil_div(n, BLOCK_SUM_THREADS)
    out = np.zeros(blocks, dtype=np.float32)
    check_races(kernel, "block_sum", blocks, BLOCK_SUM_THREADS, out, x, case=f"n={n}")


# ----------------------------------------------------------------------------- Part 4


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
        launch(kernel, "matmul_tiled", blocks, (TILE, TILE), c.view, cuda.to_device(a),
               cuda.to_device(b), cuda.to_device(bias), case=case)
        got = c.result("matmul_tiled", case)
        product = a.astype(np.float64) @ b.astype(np.float64)
        want = product + bias
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


# ----------------------------------------------------------------------------- Part 5


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
        launch(kernel, "histogram", blocks, tpb, counts.view, cuda.to_device(x),
               np.int32(HISTOGRAM_WIDTH), case=case)
        got = counts.result("histogram", case, dtype=np.int64)
        want = histogram_reference(x // HISTOGRAM_WIDTH, HISTOGRAM_BINS).astype(np.int64)
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


# ----------------------------------------------------------------------------- Part 6


def check_waves(n_waves, tail_utilization, utilization, *, gpu, n_blocks, blocks_per_sm):
    """The waves of `n_blocks` blocks on `gpu` at `blocks_per_sm` resident blocks per SM:
    n_waves rounds, the last one's busy fraction, and the busy fraction over all rounds."""
    spec = get_gpu(gpu)
    w = waves(n_blocks, spec, blocks_per_sm)
    setting = (f"{n_blocks} blocks on an {spec.name} ({spec.sms} SMs) with {blocks_per_sm} "
               f"blocks per SM: {w.slots} blocks run at once")
    got = as_number(n_waves, "n_waves")
    if got != w.waves_ceil:
        hint = ("The GPU runs whole rounds: round n_blocks / slots up."
                if np.isclose(got, w.waves, rtol=1e-3) else
                "A round (wave) runs `slots` = SMs x blocks_per_sm blocks at once.")
        raise AssertionError(f"n_waves is {got:g}, expected {w.waves_ceil} ({setting}). {hint}")
    tail = w.tail_blocks / w.slots
    got = as_number(tail_utilization, "tail_utilization")
    if not np.isclose(got, tail, rtol=1e-3, atol=1e-4):
        raise AssertionError(
            f"tail_utilization is {got:.4f}, expected {tail:.4f} ({setting}). The last wave "
            f"runs the {w.tail_blocks} blocks left after {w.waves_ceil - 1} full wave(s) of "
            f"{w.slots}; give the fraction of its {w.slots} slots that are busy (0 to 1).")
    got = as_number(utilization, "utilization")
    if not np.isclose(got, w.utilization, rtol=1e-3, atol=1e-4):
        raise AssertionError(
            f"utilization is {got:.4f}, expected {w.utilization:.4f} ({setting}). It is the "
            f"useful work over the slots the GPU spends: n_blocks / (n_waves x slots).")
