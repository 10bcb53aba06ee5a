"""gpulab/kernels/transpose.py on the simulator: naive, tiled and padded transposes equal a.T for
square and rectangular matrices, multiples of TILE and not, down to 1 x 1."""

import numpy as np
import pytest
from numba import cuda

from gpulab.kernels import transpose as tp

VERSIONS = [pytest.param(tp.transpose_kernel_v1, id="v1_naive"),
            pytest.param(tp.transpose_kernel_v2, id="v2_tile"),
            pytest.param(tp.transpose_kernel_v3, id="v3_padded_tile")]

# (R, C). Each 256-thread block costs about 0.15 s on the simulator.
SHAPES = [(1, 1), (tp.TILE, tp.TILE), (33, 47), (1, 70), (40, 3)]


@pytest.mark.parametrize("kernel", VERSIONS)
@pytest.mark.parametrize("r, c", SHAPES)
def test_transpose_matches_reference(kernel, r, c):
    # Distinct values, so a misplaced element cannot hide behind an equal one.
    a = np.arange(r * c, dtype=np.float32).reshape(r, c)
    got = tp.launch_transpose(kernel, a)
    assert got.shape == (c, r)
    np.testing.assert_array_equal(got, tp.transpose_reference(a))


@cuda.jit
def _one_element_per_thread(out, a):
    # The first transpose a learner writes: no loop, one element per thread.
    col, row = cuda.grid(2)
    if row < a.shape[0] and col < a.shape[1]:
        out[col, row] = a[row, col]


def test_launcher_runs_a_one_element_per_thread_kernel():
    a = np.random.default_rng(0).standard_normal((20, 9)).astype(np.float32)
    got = tp.launch_transpose(_one_element_per_thread, a, threads_per_block=(tp.TILE, tp.TILE))
    np.testing.assert_array_equal(got, a.T)


def test_padding_spreads_a_tile_column_over_all_banks():
    # Bank of the 4-byte word at tile[r, c] is (r * row_length + c) % 32. A warp reads the
    # column tile[0..31, c] in the write phase.
    banks = 32
    rows = np.arange(tp.TILE)
    assert len(set((rows * tp.TILE) % banks)) == 1  # v2: all 32 reads in one bank
    assert len(set((rows * tp.PADDED_TILE) % banks)) == banks  # v3: one read per bank


def test_launcher_rejects_a_vector():
    with pytest.raises(ValueError, match="2-D"):
        tp.launch_transpose(tp.transpose_kernel_v1, np.zeros(5))


def test_napkin_math():
    assert tp.transpose_bytes(1000, 300) == 2 * 1000 * 300 * 4
