"""Real Numba CUDA kernels, one op per file, in the order lessons/02_cuda_with_numba.ipynb
teaches them:

    vector_add.py   vector add (one thread per element), SAXPY (grid-stride loop)
    matmul.py       naive and tiled (shared-memory) matrix multiply
    reduce.py       sum: atomics, shared-memory tree, warp shuffles
    histogram.py    global atomics, privatized shared-memory histogram
    transpose.py    naive, shared-memory tile, padded tile (bank conflicts)

Each file reads top to bottom: `<op>_reference` (NumPy, the ground truth), the numbered kernels
`<op>_kernel_v1`, `_v2`, ..., a launcher that copies to the device, picks the grid, launches
any kernel with the op's signature and copies the result back, then the napkin math (bytes
moved, FLOPs) to turn a time into GB/s or TFLOP/s.

    from gpulab.kernels import launch_matmul, matmul_reference
    from gpulab.kernels.matmul import matmul_kernel_v2
    c = launch_matmul(matmul_kernel_v2, a, b)

Kernels compile lazily, on their first launch, so importing this package is cheap.
"""

from gpulab.kernels.histogram import histogram_reference, launch_histogram
from gpulab.kernels.matmul import launch_matmul, matmul_reference
from gpulab.kernels.reduce import launch_reduce, reduce_reference
from gpulab.kernels.transpose import launch_transpose, transpose_reference
from gpulab.kernels.vector_add import (
    launch_saxpy,
    launch_vector_add,
    saxpy_reference,
    vector_add_reference,
)

__all__ = [
    "histogram_reference",
    "launch_histogram",
    "launch_matmul",
    "launch_reduce",
    "launch_saxpy",
    "launch_transpose",
    "launch_vector_add",
    "matmul_reference",
    "reduce_reference",
    "saxpy_reference",
    "transpose_reference",
    "vector_add_reference",
]
