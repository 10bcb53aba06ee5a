"""Lab 1's technique checkers: right values computed the wrong way lose the technique's points.

Each checker runs the solution's way (passes) and the ways learners skip the technique: a naive
matmul, a matmul that stages only `a`, a block sum that thread 0 adds up alone, one whose threads
each load a run of their own (uncoalesced), a tree in global memory, a histogram of global
atomics, a stencil reading its taps from global memory, a scan that thread 0 walks. Each of
those gets the values right (the value checker passes) and fails the technique checker with a
message that names the technique and the number that shows it. On the cpu runner the evidence
is the simulator's trace.
"""


import numpy as np
import pytest
from lab_submissions import fails
from numba import cuda, float32, int32

import gpulab
from gpulab.checks.lab1 import (
    check_block_scan,
    check_block_scan_races,
    check_block_scan_technique,
    check_block_sum,
    check_block_sum_technique,
    check_histogram,
    check_histogram_technique,
    check_matmul_tiled,
    check_matmul_tiled_technique,
    check_stencil,
    check_stencil_races,
    check_stencil_technique,
)
from gpulab.checks.lab1.config import BLOCK_SUM_THREADS as THREADS
from gpulab.checks.lab1.config import HISTOGRAM_BINS as BINS
from gpulab.checks.lab1.config import ITEMS_PER_THREAD as ITEMS
from gpulab.checks.lab1.config import (
    RADIUS,
    SCAN_THREADS,
    STENCIL_THREADS,
    TILE,
)
from gpulab.checks.lab1.matmul_tiled import tiled_read_bytes
from gpulab.checks.lab1.stencil import stencil_reference

pytestmark = [pytest.mark.lab1, pytest.mark.skipif(
    not gpulab.runner.simulator, reason="the trace is the cpu runner's evidence")]


# ----------------------------------------------------------------------------- matmul


HALF = TILE // 2  # blocks of (TILE, HALF) threads, two rows of c per thread


@cuda.jit
def matmul_tiled(c, a, b, bias):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.blockIdx.x * TILE + tx, cuda.blockIdx.y * TILE + ty
    m, k_dim = a.shape
    n = b.shape[1]
    top, bottom = float32(0.0), float32(0.0)
    for t in range((k_dim + TILE - 1) // TILE):
        for r in range(ty, TILE, HALF):
            a_row, k = cuda.blockIdx.y * TILE + r, t * TILE + tx
            a_tile[r, tx] = a[a_row, k] if a_row < m and k < k_dim else float32(0.0)
            k = t * TILE + r
            b_tile[r, tx] = b[k, col] if k < k_dim and col < n else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            top += a_tile[ty, j] * b_tile[j, tx]
            bottom += a_tile[ty + HALF, j] * b_tile[j, tx]
        cuda.syncthreads()
    if col < n:
        if row < m:
            c[row, col] = top + bias[col]
        if row + HALF < m:
            c[row + HALF, col] = bottom + bias[col]


@cuda.jit
def matmul_naive(c, a, b, bias):
    col, row = cuda.blockIdx.x * TILE + cuda.threadIdx.x, cuda.blockIdx.y * TILE + cuda.threadIdx.y
    for r in range(row, row + TILE, HALF):
        if r < c.shape[0] and col < c.shape[1]:
            acc = float32(0.0)
            for k in range(a.shape[1]):
                acc += a[r, k] * b[k, col]
            c[r, col] = acc + bias[col]


@cuda.jit
def matmul_a_only(c, a, b, bias):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.blockIdx.x * TILE + tx, cuda.blockIdx.y * TILE + ty
    m, k_dim = a.shape
    top, bottom = float32(0.0), float32(0.0)
    for t in range((k_dim + TILE - 1) // TILE):
        for r in range(ty, TILE, HALF):
            a_row, k = cuda.blockIdx.y * TILE + r, t * TILE + tx
            a_tile[r, tx] = a[a_row, k] if a_row < m and k < k_dim else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            kk = t * TILE + j
            if kk < k_dim and col < b.shape[1]:
                b_value = b[kk, col]  # from global memory, once for both outputs
                top += a_tile[ty, j] * b_value
                bottom += a_tile[ty + HALF, j] * b_value
        cuda.syncthreads()
    if col < b.shape[1]:
        if row < m:
            c[row, col] = top + bias[col]
        if row + HALF < m:
            c[row + HALF, col] = bottom + bias[col]


def test_the_formula_counts_each_tile_once_per_block():
    assert tiled_read_bytes(16, 24, 16, tile=8) == {"a": 16 * 24 * 2 * 4, "b": 24 * 16 * 2 * 4}


def test_a_tiled_matmul_passes_both_checks():
    check_matmul_tiled(matmul_tiled)
    check_matmul_tiled_technique(matmul_tiled)


def test_a_naive_matmul_keeps_its_values_and_loses_the_technique():
    check_matmul_tiled(matmul_naive)  # the numbers are right
    text = fails(check_matmul_tiled_technique, matmul_naive,
                 r"^Stage each TILE x TILE tile of `a` in shared memory.*reads 8\.0x the global "
                 r"bytes of `a` that a TILE=8 tiled matmul reads.*every thread reads a whole row "
                 r"of `a` from global memory")
    assert "The values are right" in text


def test_staging_only_a_is_half_the_technique():
    check_matmul_tiled(matmul_a_only)
    fails(check_matmul_tiled_technique, matmul_a_only,
          r"tile of `b` in shared memory.*reads 4\.0x the global bytes of `b`.*whole column of "
          r"`b`")


# ----------------------------------------------------------------------------- block sum


def coarsened_block_sum(element):
    """A block sum whose thread t adds the elements element(start, k, t), k < ITEMS, then a tree."""

    @cuda.jit
    def kernel(out, x):
        cache = cuda.shared.array(THREADS, float32)
        t = cuda.threadIdx.x
        total = float32(0.0)
        for k in range(ITEMS):
            i = element(cuda.blockIdx.x * ITEMS * THREADS, k, t)
            if i < x.size:
                total += x[i]
        cache[t] = total
        cuda.syncthreads()
        stride = THREADS // 2
        while stride > 0:
            if t < stride:
                cache[t] += cache[t + stride]
            cuda.syncthreads()
            stride //= 2
        if t == 0:
            out[cuda.blockIdx.x] = cache[0]

    return kernel


@cuda.jit(device=True)
def _interleaved(start, k, t):
    return start + k * THREADS + t  # the block reads THREADS neighbours at a time


@cuda.jit(device=True)
def _own_run(start, k, t):
    return start + t * ITEMS + k  # each thread a run of its own: a warp's loads 4 apart


block_sum_tree = coarsened_block_sum(_interleaved)
block_sum_strided = coarsened_block_sum(_own_run)


@cuda.jit
def block_sum_serial(out, x):
    cache = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    total = float32(0.0)
    for k in range(ITEMS):
        i = cuda.blockIdx.x * ITEMS * THREADS + k * THREADS + t
        if i < x.size:
            total += x[i]
    cache[t] = total
    cuda.syncthreads()
    if t == 0:
        total = float32(0.0)
        for j in range(THREADS):
            total += cache[j]
        out[cuda.blockIdx.x] = total


@cuda.jit
def block_sum_global_tree(out, x):
    t = cuda.threadIdx.x
    start = cuda.blockIdx.x * ITEMS * THREADS
    total = float32(0.0)
    for k in range(ITEMS):
        if start + k * THREADS + t < x.size:
            total += x[start + k * THREADS + t]
    cuda.syncthreads()  # every element read before the block's first THREADS are overwritten
    if start + t < x.size:
        x[start + t] = total
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:  # in place, in global memory: right, but every step goes to DRAM
        if t < stride and start + t + stride < x.size:
            x[start + t] += x[start + t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = x[start]


def test_a_tree_passes_both_checks():
    check_block_sum(block_sum_tree)
    check_block_sum_technique(block_sum_tree)


def test_thread_zero_adding_the_block_loses_the_technique():
    check_block_sum(block_sum_serial)
    fails(check_block_sum_technique, block_sum_serial,
          r"^Combine the threads' sums as a tree: halve the active threads each step: no thread "
          r"should read more than 17 elements.*thread 0 of block 0 read 68 elements, one by "
          r"one: O\(THREADS\) work for one thread, where a tree takes log2\(64\) = 6 steps")


def test_loads_each_thread_takes_as_a_run_of_its_own_lose_the_technique():
    check_block_sum(block_sum_strided)
    text = fails(check_block_sum_technique, block_sum_strided,
                 r"^Let neighbouring threads load neighbouring elements: .*loads x with 16\.0 "
                 r"sectors of 32 B per warp request, where coalesced loads take 4")
    assert "The values are right" in text


def test_a_tree_outside_shared_memory_loses_the_technique():
    check_block_sum(block_sum_global_tree, sizes=[512])
    fails(check_block_sum_technique, block_sum_global_tree,
          r"Keep the partial results in a cuda.shared.array: block_sum .* never read "
          r"shared memory")


# ----------------------------------------------------------------------------- histogram


@cuda.jit
def histogram_global(counts, x, bin_width):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = x[i] // bin_width
        if b < counts.size:
            cuda.atomic.add(counts, b, 1)


@cuda.jit
def histogram_private(counts, x, bin_width):
    local = cuda.shared.array(BINS, int32)
    t = cuda.threadIdx.x
    for b in range(t, BINS, cuda.blockDim.x):
        local[b] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = x[i] // bin_width
        if b < BINS:
            cuda.atomic.add(local, b, 1)
    cuda.syncthreads()
    for b in range(t, BINS, cuda.blockDim.x):
        cuda.atomic.add(counts, b, local[b])


def test_a_privatized_histogram_passes_both_checks():
    check_histogram(histogram_private)
    check_histogram_technique(histogram_private)


def test_a_global_atomic_per_value_loses_the_technique():
    check_histogram(histogram_global)
    text = fails(check_histogram_technique, histogram_global,
                 r"^Count into a shared-memory copy of the bins.*made \d+ global atomic adds for "
                 r"512 values, \d+ of them in block \d, where a privatized histogram makes at "
                 r"most 16 per block")
    assert "The values are right" in text


def test_technique_checks_never_score_a_stub():
    @cuda.jit
    def stub(out, x):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="raised NotImplementedError"):
        check_block_sum_technique(stub)
    assert np.isfinite(1.0)


# ----------------------------------------------------------------------------- stencil

R, ST = RADIUS, STENCIL_THREADS


@cuda.jit
def stencil_tiled(out, x, w):
    tile = cuda.shared.array(ST + 2 * R, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    tile[t + R] = x[i] if i < x.size else 0.0
    if t < R:  # the halo on the left, and on the right
        j = i - R
        tile[t] = x[j] if 0 <= j < x.size else 0.0
        j = i + ST
        tile[t + ST + R] = x[j] if j < x.size else 0.0
    cuda.syncthreads()
    if i < out.size:
        total = float32(0.0)
        for j in range(2 * R + 1):
            total += w[j] * tile[t + j]
        out[i] = total


@cuda.jit
def stencil_global(out, x, w):
    i = cuda.grid(1)
    if i < out.size:
        total = float32(0.0)
        for j in range(2 * R + 1):
            k = i + j - R
            if 0 <= k < x.size:
                total += w[j] * x[k]
        out[i] = total


@cuda.jit
def stencil_no_halo(out, x, w):
    tile = cuda.shared.array(ST + 2 * R, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    tile[t + R] = x[i] if i < x.size else 0.0
    if t < R:  # forgot to load the halo: zeros instead
        tile[t] = 0.0
        tile[t + ST + R] = 0.0
    cuda.syncthreads()
    if i < out.size:
        total = float32(0.0)
        for j in range(2 * R + 1):
            total += w[j] * tile[t + j]
        out[i] = total


def test_a_stencil_with_its_halo_in_shared_memory_passes_all_checks():
    check_stencil(stencil_tiled)
    check_stencil_races(stencil_tiled)
    check_stencil_technique(stencil_tiled)


def test_a_stencil_reading_every_tap_from_global_keeps_its_values_and_loses_the_technique():
    check_stencil(stencil_global)
    fails(check_stencil_technique, stencil_global,
          r"^Load each block's x, with a halo of RADIUS on each side, into shared memory once.*"
          r"reads 6\.3x the global bytes of x.*\(3536 B against 560 B\).*every thread reads "
          r"its 7 taps from global")


def test_a_missing_halo_is_named_by_the_values_check():
    fails(check_stencil, stencil_no_halo, r"Only outputs within RADIUS of a block's edge are "
          r"wrong: the halo")


def test_the_stencil_reference_is_a_zero_padded_correlation():
    x, w = np.arange(5, dtype=np.float32), np.zeros(2 * R + 1, np.float32)
    w[R + 1] = 1.0  # out[i] = x[i + 1]
    assert stencil_reference(x, w).tolist() == [1, 2, 3, 4, 0]


# ----------------------------------------------------------------------------- scan


@cuda.jit
def scan_hillis_steele(out, x):
    cache = cuda.shared.array(SCAN_THREADS, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    cache[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    offset = 1
    while offset < SCAN_THREADS:
        add = cache[t - offset] if t >= offset else float32(0.0)
        cuda.syncthreads()  # every read of this step before any write
        cache[t] += add
        cuda.syncthreads()
        offset *= 2
    if i < out.size:
        out[i] = cache[t]


@cuda.jit
def scan_serial(out, x):
    cache = cuda.shared.array(SCAN_THREADS, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    cache[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    if t == 0:
        for j in range(1, SCAN_THREADS):
            cache[j] += cache[j - 1]
    cuda.syncthreads()
    if i < out.size:
        out[i] = cache[t]


@cuda.jit
def scan_exclusive(out, x):
    cache = cuda.shared.array(SCAN_THREADS, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    cache[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    offset = 1
    while offset < SCAN_THREADS:
        add = cache[t - offset] if t >= offset else float32(0.0)
        cuda.syncthreads()
        cache[t] += add
        cuda.syncthreads()
        offset *= 2
    if i < out.size:
        out[i] = cache[t] - x[i]


def test_a_parallel_scan_passes_all_checks():
    check_block_scan(scan_hillis_steele)
    check_block_scan_races(scan_hillis_steele)
    check_block_scan_technique(scan_hillis_steele)


def test_thread_zero_walking_the_block_keeps_its_values_and_loses_the_technique():
    check_block_scan(scan_serial)
    fails(check_block_scan_technique, scan_serial,
          r"^Scan in log2\(THREADS\) steps.*thread 0 of block 0 read \d+ elements, one by one")


def test_an_exclusive_scan_is_named_by_the_values_check():
    fails(check_block_scan, scan_exclusive, r"That is the exclusive scan")
