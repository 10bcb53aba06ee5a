"""gpulab/kernels/reduce.py on the simulator: each reduction equals NumPy's sum for sizes that are
and are not multiples of the block. v3 needs warp shuffles, which only a GPU has."""

import numpy as np
import pytest

import gpulab
from gpulab.kernels import reduce as rd

SIZES = [1, rd.THREADS - 1, rd.THREADS, rd.THREADS + 1, 700]

needs_shuffles = pytest.mark.skipif(
    gpulab.runner.simulator,
    reason="reduce_kernel_v3 uses cuda.shfl_down_sync, which Numba's CUDA simulator lacks "
           "(numba/cuda/simulator/kernelapi.py has no shuffles); it runs on the gpu runner")

VERSIONS = [
    pytest.param(rd.reduce_kernel_v1, id="v1_atomics"),
    pytest.param(rd.reduce_kernel_v2, id="v2_shared_tree"),
    pytest.param(rd.reduce_kernel_v3, id="v3_warp_shuffle", marks=needs_shuffles),
]


def _integers(n, seed):
    # Small whole numbers are exact in float32 and so are their sums (below 2**24), whatever the
    # order of the adds: any difference from NumPy is a bug, not rounding.
    return np.random.default_rng(seed).integers(-8, 9, n).astype(np.float32)


@pytest.mark.parametrize("kernel", VERSIONS)
@pytest.mark.parametrize("n", SIZES)
def test_reduce_is_exact_on_whole_numbers(kernel, n):
    x = _integers(n, seed=n)
    got = rd.launch_reduce(kernel, x)
    assert got == rd.reduce_reference(x), f"n={n}: got {got}, expected {rd.reduce_reference(x)}"


@pytest.mark.parametrize("kernel", VERSIONS)
def test_reduce_close_on_random_floats(kernel):
    x = np.random.default_rng(1).standard_normal(600).astype(np.float32)
    # float32 adds in another order than the float64 reference: allow rounding, not a lost value.
    np.testing.assert_allclose(rd.launch_reduce(kernel, x), rd.reduce_reference(x),
                               rtol=1e-5, atol=1e-4)


def test_atomic_version_works_with_any_block_size():
    x = _integers(300, seed=4)
    assert rd.launch_reduce(rd.reduce_kernel_v1, x, threads_per_block=32) == rd.reduce_reference(x)


def test_reduce_of_an_empty_array_is_zero():
    # One block of idle threads: every thread is past the end and adds nothing.
    assert rd.launch_reduce(rd.reduce_kernel_v1, np.zeros(0, np.float32)) == 0.0


def test_block_shape_constants_fit_the_warp_version():
    assert rd.THREADS % rd.WARP_SIZE == 0 and rd.THREADS & (rd.THREADS - 1) == 0
    assert rd.WARPS_PER_BLOCK <= rd.WARP_SIZE  # one warp can sum the warps' sums


def test_napkin_math():
    assert rd.reduce_bytes(1000) == 4000
    assert rd.reduce_flops(1000) == 1000
