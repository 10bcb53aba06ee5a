"""Matrix transpose out = a.T for a float32 matrix a of shape (R, C); out has shape (C, R).

transpose_reference   NumPy, the ground truth
transpose_kernel_v1   naive: coalesced reads along a's rows, strided writes down out's columns
transpose_kernel_v2   shared-memory tile: read a tile along rows, write it out along rows too
transpose_kernel_v3   the same tile padded to TILE x (TILE + 1) against bank conflicts
Taught in: lessons/02_cuda_with_numba.ipynb

All three launch the same grid: one block per TILE x TILE tile of a, with blocks of
TILE x BLOCK_ROWS threads, so each thread moves TILE // BLOCK_ROWS elements of its column of the
tile. They differ only in how they touch memory, which is the point of the comparison.

Napkin math: no arithmetic, 2 * R * C floats moved, so the only figure is GB/s, and the ceiling is
a plain copy's. v1's writes land R floats apart, so a warp's 32 stores touch 32 memory segments.
v2 and v3 turn the tile around in shared memory, where a strided access costs little, so both
global reads and writes are coalesced. Shared memory is split into 32 banks of 4 bytes: reading
a column of a 32-wide tile hits one bank 32 times (the reads queue up); one padding float per
row shifts each row by one bank and the column spreads over all 32.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from gpulab.kernels.common import as_float32, blocks_for, check_threads_per_block

TILE = 32  # the tile edge: one warp spans a row of the tile; as many columns as there are banks
BLOCK_ROWS = 8  # rows of threads per block: 32 x 8 = 256 threads, each moving TILE // 8 = 4 rows
# v3's row length. A shared array's shape must be a constant when the kernel compiles, and
# Numba does not fold `TILE + 1` written inside a kernel, so the sum is a constant of its own.
PADDED_TILE = TILE + 1


# ----------------------------------------------------------------------------- reference


def transpose_reference(a: np.ndarray) -> np.ndarray:
    """(R, C) -> (C, R), as a new C-contiguous float32 array."""
    return np.ascontiguousarray(np.asarray(a).T, dtype=np.float32)


# ----------------------------------------------------------------------------- kernels


@cuda.jit
def transpose_kernel_v1(out, a):
    """Naive: thread (x, y) copies a[row, col] to out[col, row] for its rows of the tile.
    Neighbouring threads (x) read neighbouring columns of a: coalesced. They write to
    neighbouring rows of out, R floats apart: one memory transaction per thread."""
    col = cuda.blockIdx.x * TILE + cuda.threadIdx.x
    row = cuda.blockIdx.y * TILE + cuda.threadIdx.y
    for j in range(0, TILE, BLOCK_ROWS):
        if row + j < a.shape[0] and col < a.shape[1]:  # the edge tiles may stick out of a
            out[col, row + j] = a[row + j, col]


@cuda.jit
def transpose_kernel_v2(out, a):
    """Tiled: the block reads its tile of a along rows into shared memory, waits, then writes
    the tile's columns as rows of out, again along rows. Blocks of exactly (TILE, BLOCK_ROWS)."""
    tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    for j in range(0, TILE, BLOCK_ROWS):
        if row + j < a.shape[0] and col < a.shape[1]:
            tile[ty + j, tx] = a[row + j, col]  # coalesced read
    cuda.syncthreads()  # the whole tile is in before any thread reads another thread's element
    # The tile at block (bx, by) of a lands at block (by, bx) of out; x runs along out's rows.
    col = cuda.blockIdx.y * TILE + tx
    row = cuda.blockIdx.x * TILE + ty
    for j in range(0, TILE, BLOCK_ROWS):
        if row + j < out.shape[0] and col < out.shape[1]:
            out[row + j, col] = tile[tx, ty + j]  # coalesced write; a column of the tile


@cuda.jit
def transpose_kernel_v3(out, a):
    """v2 with one padding column: element [r, c] of the tile sits at word r * (TILE + 1) + c,
    so the 32 threads of a warp reading tile[tx, k] hit 32 different banks."""
    tile = cuda.shared.array((TILE, PADDED_TILE), float32)  # the last column is never used
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    for j in range(0, TILE, BLOCK_ROWS):
        if row + j < a.shape[0] and col < a.shape[1]:
            tile[ty + j, tx] = a[row + j, col]
    cuda.syncthreads()
    col = cuda.blockIdx.y * TILE + tx
    row = cuda.blockIdx.x * TILE + ty
    for j in range(0, TILE, BLOCK_ROWS):
        if row + j < out.shape[0] and col < out.shape[1]:
            out[row + j, col] = tile[tx, ty + j]  # no bank conflicts thanks to the padding


# ----------------------------------------------------------------------------- launcher


def transpose_blocks(r: int, c: int) -> tuple[int, int]:
    """The grid for an (R, C) input: one block per TILE x TILE tile, x along a's columns."""
    return blocks_for(c, TILE), blocks_for(r, TILE)


def launch_transpose(kernel, a, *, threads_per_block=(TILE, BLOCK_ROWS)) -> np.ndarray:
    """Run `kernel(out, a)` with one block per TILE x TILE tile of a; return out, shape (C, R).

    `kernel` is any @cuda.jit function with that signature (v1, v2, v3 or a learner's own).
    The grid is fixed by TILE. threads_per_block is (TILE, BLOCK_ROWS), what v1 to v3 expect;
    pass (TILE, TILE) for a kernel that moves one element per thread.
    """
    tpb = check_threads_per_block(threads_per_block, 2)
    a = as_float32("a", a, 2)
    r, c = a.shape
    d_a = cuda.to_device(a)
    d_out = cuda.device_array((c, r), dtype=np.float32)  # every element is written once
    kernel[transpose_blocks(r, c), tpb](d_out, d_a)
    return d_out.copy_to_host()


# ----------------------------------------------------------------------------- napkin math


def transpose_bytes(r: int, c: int, itemsize: int = 4) -> int:
    """Global traffic: read every element once, write it once."""
    return 2 * r * c * itemsize
