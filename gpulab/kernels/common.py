"""Small helpers that every launcher in gpulab/kernels/ shares: grid sizes and input checks.

A launcher's job is the same for every op: put the inputs on the device, choose `blocks` for the
given `threads_per_block`, launch, copy the result back. The arithmetic for `blocks` lives here
so that every op rounds the same way.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np


def ceil_div(n: int, d: int) -> int:
    """The number of size-`d` pieces that cover `n` items: ceil(n / d) in integer arithmetic.

    blocks = ceil_div(n, threads_per_block) launches enough threads for every element; the last
    block is partly idle, which is why every kernel guards with `if i < n`.
    """
    return -(-n // d)


def blocks_for(n: int, threads_per_block: int) -> int:
    """Blocks that give one thread per item, and at least one (CUDA refuses a grid of 0 blocks)."""
    return max(1, ceil_div(n, threads_per_block))


def check_threads_per_block(threads_per_block, dims: int) -> tuple[int, ...]:
    """`threads_per_block` as a tuple of `dims` positive ints, or a ValueError that says why."""
    tpb = (threads_per_block,) if np.isscalar(threads_per_block) else tuple(threads_per_block)
    if len(tpb) != dims or any(int(t) < 1 for t in tpb):
        raise ValueError(f"threads_per_block={threads_per_block!r}: expected {dims} positive "
                         f"int(s), one per dimension of the grid")
    if int(np.prod(tpb)) > 1024:
        raise ValueError(f"threads_per_block={threads_per_block!r} asks for {int(np.prod(tpb))} "
                         "threads, but a CUDA block holds at most 1024")
    return tuple(int(t) for t in tpb)


def as_float32(name: str, a, ndim: int) -> np.ndarray:
    """`a` as a C-contiguous float32 array with `ndim` dimensions (the kernels are written for
    float32 row-major data), or a ValueError naming the argument."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {a.shape}; expected a {ndim}-D array")
    return a
