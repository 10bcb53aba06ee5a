"""Histogram: count how many elements of an integer array fall in each bin.

x holds bin indices (for example the bytes of an image, 256 bins); values outside
[0, n_bins) are ignored, by the reference and by every kernel.

histogram_reference   NumPy, the ground truth
histogram_kernel_v1   one global atomic add per element on the bins
histogram_kernel_v2   privatized: each block counts into its own copy of the bins in shared
                      memory, then adds its copy into the global bins (one atomic per bin)
Taught in: lessons/02_cuda_with_numba.ipynb

Napkin math: n reads and at least n increments. v1 sends all n increments to global memory as
atomics, and when many elements fall in the same bin they wait in line for the same address.
v2 keeps those collisions inside the block, in fast shared memory, and sends only
blocks * n_bins atomics to global memory; its grid-stride loop keeps `blocks` small.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32

from gpulab.kernels.common import blocks_for, check_threads_per_block

MAX_BINS = 256  # the shared-memory copy in v2 is sized at compile time: 256 * 4 B = 1 KiB


# ----------------------------------------------------------------------------- reference


def histogram_reference(x: np.ndarray, n_bins: int) -> np.ndarray:
    """counts[b] = number of elements of x equal to b, for b in [0, n_bins); as int32."""
    x = np.asarray(x).ravel()
    inside = x[(x >= 0) & (x < n_bins)].astype(np.int64)
    return np.bincount(inside, minlength=n_bins).astype(np.int32)


# ----------------------------------------------------------------------------- kernels


@cuda.jit
def histogram_kernel_v1(bins, x):
    """One thread per element: add 1 to the element's bin with an atomic add, because two
    threads may hit the same bin at once and a plain `bins[v] += 1` would lose one of them."""
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        if v >= 0 and v < bins.size:  # an out-of-range value would write outside `bins`
            cuda.atomic.add(bins, v, 1)


@cuda.jit
def histogram_kernel_v2(bins, x):
    """Privatized: zero a block-private histogram in shared memory, count this block's elements
    into it (grid-stride loop, shared-memory atomics), then merge it into the global bins.
    Works with any block size; needs bins.size <= MAX_BINS."""
    local = cuda.shared.array(MAX_BINS, int32)
    t = cuda.threadIdx.x
    for b in range(t, MAX_BINS, cuda.blockDim.x):  # the block's threads share the zeroing
        local[b] = 0
    cuda.syncthreads()  # all zeros are written before anyone counts
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        if v >= 0 and v < bins.size:
            cuda.atomic.add(local, v, 1)
    cuda.syncthreads()  # all counts are in before anyone reads them
    for b in range(t, bins.size, cuda.blockDim.x):
        if local[b] > 0:  # an empty bin adds nothing: skip its global atomic
            cuda.atomic.add(bins, b, local[b])


# ----------------------------------------------------------------------------- launcher


def launch_histogram(kernel, x, n_bins: int = MAX_BINS, *, threads_per_block: int = 128,
                     blocks: int | None = None) -> np.ndarray:
    """Run `kernel(bins, x)` and return the bins as an int32 NumPy array of length n_bins.

    x is cast to int32 bin indices. blocks=None gives one thread per element, which any kernel
    needs; a grid-stride kernel (v2) also works with fewer, e.g. blocks=2 * number of SMs.
    """
    (tpb,) = check_threads_per_block(threads_per_block, 1)
    if not 1 <= n_bins <= MAX_BINS:
        raise ValueError(f"n_bins={n_bins}: expected 1 to {MAX_BINS}, the size of v2's "
                         "shared-memory histogram")
    x = np.ascontiguousarray(x, dtype=np.int32).ravel()
    blocks = blocks_for(x.size, tpb) if blocks is None else int(blocks)
    if blocks < 1:
        raise ValueError(f"blocks={blocks}: a grid needs at least one block")
    d_x = cuda.to_device(x)
    d_bins = cuda.to_device(np.zeros(n_bins, dtype=np.int32))  # counts start at zero
    kernel[blocks, tpb](d_bins, d_x)
    return d_bins.copy_to_host()


# ----------------------------------------------------------------------------- napkin math


def histogram_bytes(n: int, n_bins: int, itemsize: int = 4) -> int:
    """The least global traffic: read x once, write the bins once."""
    return n * itemsize + n_bins * 4


def histogram_global_atomics(n: int, n_bins: int, blocks: int | None = None) -> int:
    """Atomic adds that reach global memory: n for v1 (blocks=None), and at most
    blocks * n_bins for v2, whatever n is."""
    return n if blocks is None else blocks * n_bins
