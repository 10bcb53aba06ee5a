"""gpulab/kernels/vector_add.py on the simulator: every kernel equals its NumPy reference for
sizes that are and are not multiples of the block, and the launchers run any kernel."""

import numpy as np
import pytest
from numba import cuda

import gpulab
from gpulab.kernels import vector_add as va


def _pair(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))


@pytest.mark.parametrize("n, threads_per_block", [(1, 256), (255, 256), (256, 256), (257, 256),
                                                  (1000, 256), (100, 32)])
def test_vector_add_matches_reference(n, threads_per_block):
    x, y = _pair(n, seed=n)
    got = va.launch_vector_add(va.vector_add_kernel_v1, x, y,
                               threads_per_block=threads_per_block)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_array_equal(got, va.vector_add_reference(x, y))


@pytest.mark.parametrize("n, threads_per_block, blocks", [
    (1, 256, None),
    (257, 256, None),
    (1000, 32, 3),  # 96 threads for 1000 elements: each thread loops about 10 times
    (97, 16, 1),  # a single block walks the whole array
])
def test_saxpy_grid_stride_matches_reference(n, threads_per_block, blocks):
    x, y = _pair(n, seed=n + 1)
    got = va.launch_saxpy(va.saxpy_kernel_v1, -1.5, x, y,
                          threads_per_block=threads_per_block, blocks=blocks)
    np.testing.assert_allclose(got, va.saxpy_reference(-1.5, x, y), rtol=1e-6, atol=1e-6)


def test_grid_stride_blocks_is_fixed_and_never_more_than_needed():
    assert va.grid_stride_blocks(10, 256) == 1
    assert va.grid_stride_blocks(10**9, 256) == va.GRID_STRIDE_BLOCKS
    assert va.grid_stride_blocks(1000, 100, max_blocks=4) == 4


@cuda.jit
def _learner_vector_add(out, x, y):
    # What a learner writes in the lab: the same op, their own kernel and indexing.
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < x.shape[0]:
        out[i] = y[i] + x[i]


def test_launcher_runs_a_kernel_written_elsewhere():
    x, y = _pair(300, seed=3)
    got = va.launch_vector_add(_learner_vector_add, x, y, threads_per_block=64)
    np.testing.assert_array_equal(got, va.vector_add_reference(x, y))


@cuda.jit
def _unguarded_vector_add(out, x, y):
    i = cuda.grid(1)
    out[i] = x[i] + y[i]  # no `if i < n`: the rounded-up grid runs past the end


@pytest.mark.skipif(not gpulab.runner.simulator, reason="a GPU does not check indices")
def test_a_missing_guard_is_caught_on_the_simulator():
    # The simulator checks every index, so the lesson's "forgot the guard" bug is an error
    # here, where a GPU would silently write past the end of the array.
    x, y = _pair(257)
    with pytest.raises(IndexError):
        va.launch_vector_add(_unguarded_vector_add, x, y, threads_per_block=256)


def test_launchers_reject_bad_arguments():
    x, y = _pair(10)
    with pytest.raises(ValueError, match="must match"):
        va.launch_vector_add(va.vector_add_kernel_v1, x, y[:5])
    with pytest.raises(ValueError, match="at most 1024"):
        va.launch_vector_add(va.vector_add_kernel_v1, x, y, threads_per_block=2048)
    with pytest.raises(ValueError, match="at least one block"):
        va.launch_saxpy(va.saxpy_kernel_v1, 2.0, x, y, blocks=0)


def test_napkin_math():
    n = 1000
    assert va.vector_add_bytes(n) == 3 * n * 4  # x, y in; out back
    assert va.saxpy_flops(n) == 2 * va.vector_add_flops(n)
    assert va.saxpy_bytes(n, itemsize=8) == 2 * va.saxpy_bytes(n)
