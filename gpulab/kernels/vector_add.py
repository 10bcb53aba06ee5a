"""Element-wise kernels: vector add and SAXPY, the "hello world" of CUDA.

vector_add_reference   NumPy, the ground truth: out = x + y
vector_add_kernel_v1   one thread per element, guarded by `if i < n`
saxpy_reference        NumPy, the ground truth: out = a * x + y
saxpy_kernel_v1        grid-stride loop: a fixed grid of threads walks the whole array
Taught in: lessons/02_cuda_with_numba.ipynb

Napkin math: both ops read two floats and write one per element, so they are memory-bound
(1 or 2 FLOPs per 12 bytes, far below any GPU's ops:byte); their speed is their GB/s.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.kernels.common import blocks_for, check_threads_per_block

# About one full wave of 256-thread blocks on the largest GPUs (an H100 holds 132 SMs x 8
# blocks = 1056) and several on smaller ones, so no SM idles; more blocks would only add
# scheduling work, since each thread loops anyway. Small arrays get fewer (grid_stride_blocks).
GRID_STRIDE_BLOCKS = 1024


# ----------------------------------------------------------------------------- references


def vector_add_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """out[i] = x[i] + y[i] for 1-D float32 arrays of the same length."""
    return (x + y).astype(np.float32)


def saxpy_reference(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """SAXPY ("single-precision a times x plus y"): out[i] = a * x[i] + y[i]."""
    return (np.float32(a) * x + y).astype(np.float32)


# ----------------------------------------------------------------------------- kernels


@cuda.jit
def vector_add_kernel_v1(out, x, y):
    """One thread per element. The grid is rounded up to whole blocks, so the threads past the
    end of the array must do nothing: without the guard they would read and write out of bounds."""
    i = cuda.grid(1)  # blockIdx.x * blockDim.x + threadIdx.x
    if i < out.size:
        out[i] = x[i] + y[i]


@cuda.jit
def saxpy_kernel_v1(out, a, x, y):
    """Grid-stride loop: thread i handles elements i, i + stride, i + 2 * stride, ... where
    stride is the number of threads in the grid. Any grid size is then correct, and one launch
    configuration serves every array length. Neighbouring threads still touch neighbouring
    elements on each pass, so the accesses stay coalesced."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)  # blockDim.x * gridDim.x
    for i in range(start, out.size, stride):
        out[i] = a * x[i] + y[i]


# ----------------------------------------------------------------------------- launchers


def grid_stride_blocks(n: int, threads_per_block: int, max_blocks: int = GRID_STRIDE_BLOCKS) -> int:
    """A fixed number of blocks for a grid-stride kernel, and no more than the data needs."""
    return min(blocks_for(n, threads_per_block), max_blocks)


def _check_pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    y = np.ascontiguousarray(y, dtype=np.float32).ravel()
    if x.size != y.size:
        raise ValueError(f"x has {x.size} elements and y has {y.size}; they must match")
    return x, y


def launch_vector_add(kernel, x, y, *, threads_per_block: int = 256) -> np.ndarray:
    """Run `kernel(out, x, y)` with one thread per element and return out as a NumPy array.

    `kernel` is any @cuda.jit function with that signature (vector_add_kernel_v1, or a
    learner's own): blocks = ceil(n / threads_per_block).
    """
    (tpb,) = check_threads_per_block(threads_per_block, 1)
    x, y = _check_pair(x, y)
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)  # host -> device copies
    d_out = cuda.device_array_like(x)  # uninitialised: the kernel writes every element
    kernel[blocks_for(x.size, tpb), tpb](d_out, d_x, d_y)
    return d_out.copy_to_host()  # device -> host; waits for the kernel to finish


def launch_saxpy(kernel, a: float, x, y, *, threads_per_block: int = 256,
                 blocks: int | None = None) -> np.ndarray:
    """Run the grid-stride `kernel(out, a, x, y)` and return out as a NumPy array.

    blocks=None picks a fixed count, grid_stride_blocks(n, threads_per_block); pass a small
    `blocks` to watch each thread loop over several elements. Only a grid-stride kernel is
    correct with fewer threads than elements.
    """
    (tpb,) = check_threads_per_block(threads_per_block, 1)
    x, y = _check_pair(x, y)
    blocks = grid_stride_blocks(x.size, tpb) if blocks is None else int(blocks)
    if blocks < 1:
        raise ValueError(f"blocks={blocks}: a grid needs at least one block")
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)
    d_out = cuda.device_array_like(x)
    kernel[blocks, tpb](d_out, np.float32(a), d_x, d_y)
    return d_out.copy_to_host()


# ----------------------------------------------------------------------------- napkin math


def vector_add_bytes(n: int, itemsize: int = 4) -> int:
    """Bytes to and from global memory: read x and y, write out."""
    return 3 * n * itemsize


def vector_add_flops(n: int) -> int:
    """One add per element."""
    return n


def saxpy_bytes(n: int, itemsize: int = 4) -> int:
    """Bytes to and from global memory: read x and y, write out (a sits in a register)."""
    return 3 * n * itemsize


def saxpy_flops(n: int) -> int:
    """One multiply and one add per element."""
    return 2 * n
