"""gpulab/kernels/matmul.py on the simulator: naive and tiled matmul equal NumPy for square and
rectangular shapes, multiples of TILE and not, down to 1 x 1."""

import numpy as np
import pytest

from gpulab.kernels import matmul as mm

# (M, K, N): A is M x K, B is K x N. Tiled costs about 0.15 s per 256-thread block per tile here.
SHAPES = [
    (1, 1, 1),
    (mm.TILE, mm.TILE, mm.TILE),  # exactly one tile everywhere
    (17, 9, 18),  # every dimension one past or short of a tile edge
    (5, 40, 3),  # long K: three tiles, the last one partly zeros
    (3, 2, 33),  # wide C: three blocks along x
]


def _operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def _assert_matmul_close(got, a, b):
    want = mm.matmul_reference(a, b)
    assert got.shape == want.shape and got.dtype == np.float32
    # The kernels add the K products in another order than NumPy's BLAS: last bits differ.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * a.shape[1])


@pytest.mark.parametrize("kernel", [mm.matmul_kernel_v1, mm.matmul_kernel_v2],
                         ids=["v1_naive", "v2_tiled"])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matmul_matches_reference(kernel, m, k, n):
    a, b = _operands(m, k, n, seed=m * 100 + k * 10 + n)
    _assert_matmul_close(mm.launch_matmul(kernel, a, b), a, b)


def test_naive_matmul_works_with_any_block_shape():
    a, b = _operands(19, 7, 13, seed=1)
    got = mm.launch_matmul(mm.matmul_kernel_v1, a, b, threads_per_block=(8, 4))
    _assert_matmul_close(got, a, b)


def test_tiled_matmul_32x32():
    # The size the lessons quote for the simulator (~1 s): four blocks, two tiles each.
    a, b = _operands(32, 32, 32, seed=2)
    _assert_matmul_close(mm.launch_matmul(mm.matmul_kernel_v2, a, b), a, b)


def test_launcher_casts_inputs_to_float32():
    a, b = _operands(4, 3, 5, seed=3)
    got = mm.launch_matmul(mm.matmul_kernel_v1, a.astype(np.float64), b.tolist())
    _assert_matmul_close(got, a, b)


def test_launcher_explains_a_shape_mismatch():
    a, b = _operands(4, 3, 5)
    with pytest.raises(ValueError, match=r"a's columns \(3\) must equal b's rows \(4\)"):
        mm.launch_matmul(mm.matmul_kernel_v1, a, a)
    with pytest.raises(ValueError, match="2-D"):
        mm.launch_matmul(mm.matmul_kernel_v1, a[0], b)


def test_grid_covers_c():
    bx, by = mm.matmul_blocks(m=33, n=17, threads_per_block=(16, 16))
    assert (bx, by) == (2, 3)  # x runs along C's 17 columns, y down its 33 rows
    assert mm.matmul_blocks(0, 0) == (1, 1)  # never an empty grid


def test_napkin_math():
    m, n, k = 64, 48, 32
    assert mm.matmul_flops(m, n, k) == 2 * m * n * k
    naive = mm.matmul_global_bytes(m, n, k)
    tiled = mm.matmul_global_bytes(m, n, k, tile=mm.TILE)
    assert tiled < naive / (mm.TILE / 2)  # tiling divides the operand reads by TILE
    assert mm.matmul_bytes(m, n, k) < tiled  # nothing beats reading everything once
