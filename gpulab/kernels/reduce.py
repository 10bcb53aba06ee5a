"""Sum of a 1-D float32 array.

reduce_reference   NumPy, the ground truth
reduce_kernel_v1   one atomic add per thread (simple, contended)
reduce_kernel_v2   tree reduction in shared memory, one atomic per block
reduce_kernel_v3   warp shuffles, then one warp over the warps' sums, one atomic per block
Taught in: lessons/02_cuda_with_numba.ipynb

Napkin math: a sum reads each float once and does one add per float, so it is memory-bound and
its speed is its GB/s. What differs between versions is the waiting: v1 sends n atomic adds to
one address, which the memory system must apply one at a time; v2 and v3 send one per block.
v3 keeps the first five halvings in registers (a shuffle moves a value between the 32 lanes of
a warp without shared memory or a barrier).

The simulator has no warp shuffles (it runs each thread on its own), so v3 runs on a GPU only.
Float addition is not associative: the versions add in different orders and may differ from each
other and from NumPy in the last bits, and from run to run for the atomics.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from gpulab.kernels.common import blocks_for, check_threads_per_block

THREADS = 256  # threads per block for v2 and v3: a power of two, a multiple of WARP_SIZE
WARP_SIZE = 32  # threads that execute in lockstep; shuffles exchange values within one warp
WARPS_PER_BLOCK = THREADS // WARP_SIZE  # 8: the warp sums v3 gathers in shared memory
FULL_MASK = 0xFFFFFFFF  # every lane of the warp takes part in the shuffle


# ----------------------------------------------------------------------------- reference


def reduce_reference(x: np.ndarray) -> np.float32:
    """The sum, accumulated in float64 so that it is the ground truth, returned as float32."""
    return np.float32(np.sum(x, dtype=np.float64))


# ----------------------------------------------------------------------------- kernels


@cuda.jit
def reduce_kernel_v1(out, x):
    """Every thread adds its element straight into out[0]. Correct, because an atomic add is
    an indivisible read-modify-write; slow, because the adds to one address wait in line."""
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, 0, x[i])


@cuda.jit
def reduce_kernel_v2(out, x):
    """Each block sums its THREADS elements in shared memory by halving: at each step the lower
    half of the active threads adds in the upper half, so log2(THREADS) steps leave the block's
    sum in cache[0]. Launch with blocks of exactly THREADS threads."""
    cache = cuda.shared.array(THREADS, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    cache[t] = x[i] if i < x.size else 0.0  # threads past the end add zero
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:  # halve the active threads each step
        if t < stride:
            cache[t] += cache[t + stride]
        cuda.syncthreads()  # this step's sums are written before the next step reads them
        stride //= 2
    if t == 0:
        cuda.atomic.add(out, 0, cache[0])


@cuda.jit
def reduce_kernel_v3(out, x):
    """Each warp sums its 32 values with shuffles (lane l adds the value of lane l + offset,
    offset = 16, 8, 4, 2, 1), lane 0 of each warp parks the warp's sum in shared memory, and the
    first warp sums those the same way. One barrier instead of log2(THREADS). Needs a GPU; launch
    with blocks of exactly THREADS threads."""
    warp_sums = cuda.shared.array(WARPS_PER_BLOCK, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    lane, warp = t % WARP_SIZE, t // WARP_SIZE
    value = x[i] if i < x.size else float32(0.0)
    offset = WARP_SIZE // 2
    while offset > 0:  # every lane runs every shuffle: the mask promises all 32 take part
        value += cuda.shfl_down_sync(FULL_MASK, value, offset)
        offset //= 2
    if lane == 0:
        warp_sums[warp] = value  # lane 0 holds the whole warp's sum
    cuda.syncthreads()
    if warp == 0:  # a whole warp, so the shuffles below again have all 32 lanes
        value = warp_sums[lane] if lane < WARPS_PER_BLOCK else float32(0.0)
        offset = WARP_SIZE // 2
        while offset > 0:
            value += cuda.shfl_down_sync(FULL_MASK, value, offset)
            offset //= 2
        if lane == 0:
            cuda.atomic.add(out, 0, value)


# ----------------------------------------------------------------------------- launcher


def launch_reduce(kernel, x, *, threads_per_block: int = THREADS) -> np.float32:
    """Run `kernel(out, x)` with one thread per element and return out[0], the sum.

    `kernel` is any @cuda.jit function that adds its share of x into out[0] (v1, v2, v3 or a
    learner's own); out starts at zero. v2 and v3 need threads_per_block == THREADS.
    """
    (tpb,) = check_threads_per_block(threads_per_block, 1)
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    d_x = cuda.to_device(x)
    d_out = cuda.to_device(np.zeros(1, dtype=np.float32))  # atomics add into it: start at 0
    kernel[blocks_for(x.size, tpb), tpb](d_out, d_x)
    return d_out.copy_to_host()[0]


# ----------------------------------------------------------------------------- napkin math


def reduce_bytes(n: int, itemsize: int = 4) -> int:
    """Global traffic: read every element once (the one-float result is negligible)."""
    return n * itemsize


def reduce_flops(n: int) -> int:
    """n - 1 adds, counted as n."""
    return n
