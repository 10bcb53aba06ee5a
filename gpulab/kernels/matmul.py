"""Matrix multiply C = A @ B for float32 matrices: A is (M, K), B is (K, N), C is (M, N).

matmul_reference   NumPy, the ground truth
matmul_kernel_v1   naive: one thread per element of C, every operand read from global memory
matmul_kernel_v2   tiled: a block stages TILE x TILE tiles of A and B in shared memory
Taught in: lessons/02_cuda_with_numba.ipynb

Napkin math: the op does 2*M*N*K FLOPs on (M*K + K*N + M*N) floats, so for square n it has
n/6 FLOPs per byte and should be compute-bound. v1 reads 2*K floats from global memory for each
of the M*N outputs, 2*M*N*K reads in all: it is memory-bound. v2 reads each staged float once
per tile and reuses it TILE times from shared memory, dividing global traffic by TILE.

Thread layout (both versions): x, the fast axis of a block, runs along a row of C, so the 32
threads of a warp touch 32 neighbouring columns of B and C: coalesced loads and stores.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from gpulab.kernels.common import as_float32, blocks_for, check_threads_per_block

# The tile edge: a block is TILE x TILE threads and stages one TILE x TILE tile of A and of B
# per step (2 * 16 * 16 * 4 B = 2 KiB of shared memory). 16 keeps the simulator quick; on a GPU,
# 32 (1024 threads, 8 KiB) reuses each load twice as often.
TILE = 16


# ----------------------------------------------------------------------------- reference


def matmul_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(M, K) @ (K, N) -> (M, N) in float32."""
    return np.matmul(a, b).astype(np.float32)


# ----------------------------------------------------------------------------- kernels


@cuda.jit
def matmul_kernel_v1(c, a, b):
    """Naive: thread (row, col) computes c[row, col] as the dot product of a row of A and a
    column of B, all read from global memory. Launch with any 2-D block."""
    col, row = cuda.grid(2)  # x -> column of C, y -> row of C
    if row < c.shape[0] and col < c.shape[1]:  # the grid is rounded up to whole blocks
        acc = float32(0.0)
        for k in range(a.shape[1]):
            acc += a[row, k] * b[k, col]
        c[row, col] = acc


@cuda.jit
def matmul_kernel_v2(c, a, b):
    """Tiled: the block walks along K one tile at a time. Each thread loads one element of the A
    tile and one of the B tile into shared memory, the block waits until both tiles are whole,
    each thread accumulates TILE products from shared memory, and the block waits again before
    the next tile overwrites this one. Launch with blocks of exactly (TILE, TILE) threads."""
    a_tile = cuda.shared.array((TILE, TILE), float32)  # rows of A for this block's rows of C
    b_tile = cuda.shared.array((TILE, TILE), float32)  # columns of B for this block's columns
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    m, k_dim = a.shape
    n = b.shape[1]
    acc = float32(0.0)
    for t in range((k_dim + TILE - 1) // TILE):
        # Threads outside C, or past the end of K in the last tile, load zeros: a zero adds
        # nothing to the dot product, and every thread must still reach both barriers.
        k = t * TILE + tx
        a_tile[ty, tx] = a[row, k] if row < m and k < k_dim else float32(0.0)
        k = t * TILE + ty
        b_tile[ty, tx] = b[k, col] if k < k_dim and col < n else float32(0.0)
        cuda.syncthreads()  # both tiles are loaded before anyone reads them
        for j in range(TILE):
            acc += a_tile[ty, j] * b_tile[j, tx]
        cuda.syncthreads()  # everyone is done reading before the next loads overwrite them
    if row < m and col < n:
        c[row, col] = acc


# ----------------------------------------------------------------------------- launcher


def matmul_blocks(m: int, n: int, threads_per_block=(TILE, TILE)) -> tuple[int, int]:
    """The grid (blocks along x = columns of C, blocks along y = rows of C) that covers C."""
    tpb_x, tpb_y = check_threads_per_block(threads_per_block, 2)
    return blocks_for(n, tpb_x), blocks_for(m, tpb_y)


def launch_matmul(kernel, a, b, *, threads_per_block=(TILE, TILE)) -> np.ndarray:
    """Run `kernel(c, a, b)` over a grid that covers C and return C as an (M, N) NumPy array.

    `kernel` is any @cuda.jit function with that signature (matmul_kernel_v1, _v2, or a
    learner's own). threads_per_block is (x, y): x along a row of C, y down a column. A tiled
    kernel needs it to be (TILE, TILE), the shape of its shared tiles.
    """
    tpb = check_threads_per_block(threads_per_block, 2)
    a, b = as_float32("a", a, 2), as_float32("b", b, 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {a.shape} and b is {b.shape}: a's columns ({a.shape[1]}) must "
                         f"equal b's rows ({b.shape[0]}) for a @ b")
    m, n = a.shape[0], b.shape[1]
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    d_c = cuda.device_array((m, n), dtype=np.float32)  # every element is written by one thread
    kernel[matmul_blocks(m, n, tpb), tpb](d_c, d_a, d_b)
    return d_c.copy_to_host()


# ----------------------------------------------------------------------------- napkin math


def matmul_flops(m: int, n: int, k: int) -> int:
    """A multiply and an add for each of the K terms of each of the M*N outputs."""
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, itemsize: int = 4) -> int:
    """The least global traffic possible: read A and B once, write C once."""
    return (m * k + k * n + m * n) * itemsize


def matmul_global_bytes(m: int, n: int, k: int, tile: int = 1, itemsize: int = 4) -> int:
    """Global traffic of the kernels above: each output reads 2*K operands, shared by `tile`
    outputs when staged in tiles (tile=1: naive v1; tile=TILE: tiled v2), then writes once.

    Caches catch some of v1's repeated reads on a real GPU, so this is its worst case."""
    return (2 * m * n * k // tile + m * n) * itemsize
