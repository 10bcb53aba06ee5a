"""gpulab/kernels/ on a real GPU, at sizes the simulator could not reach in a test run: many
blocks, many waves, and the warp-shuffle reduction that the simulator lacks."""

import numpy as np
import pytest

import gpulab
from gpulab.kernels import histogram as hg
from gpulab.kernels import matmul as mm
from gpulab.kernels import reduce as rd
from gpulab.kernels import transpose as tp
from gpulab.kernels import vector_add as va

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpulab.runner.name != "gpu", reason="needs the gpu runner (a real GPU)"),
]


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_vector_add_and_saxpy_large():
    n = 10_000_019  # prime: the last block is partly idle
    rng = _rng(1)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(va.launch_vector_add(va.vector_add_kernel_v1, x, y),
                                  va.vector_add_reference(x, y))
    np.testing.assert_allclose(va.launch_saxpy(va.saxpy_kernel_v1, 3.0, x, y),
                               va.saxpy_reference(3.0, x, y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", [mm.matmul_kernel_v1, mm.matmul_kernel_v2],
                         ids=["v1_naive", "v2_tiled"])
@pytest.mark.parametrize("m, k, n", [(512, 512, 512), (1000, 515, 777)])
def test_matmul_large(kernel, m, k, n):
    a = _rng(2).standard_normal((m, k)).astype(np.float32)
    b = _rng(3).standard_normal((k, n)).astype(np.float32)
    np.testing.assert_allclose(mm.launch_matmul(kernel, a, b), mm.matmul_reference(a, b),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kernel", [rd.reduce_kernel_v1, rd.reduce_kernel_v2,
                                    rd.reduce_kernel_v3], ids=["v1", "v2", "v3"])
def test_reduce_large(kernel):
    x = _rng(4).integers(-8, 9, 1_000_003).astype(np.float32)  # exact: |sum| < 2**24
    assert rd.launch_reduce(kernel, x) == rd.reduce_reference(x)
    x = _rng(5).standard_normal(4_000_037).astype(np.float32)
    # v1 rounds the running total to float32 on each of its 4M atomic adds (the total is about
    # 2000, half an ulp is 1.2e-4): a random walk of about 0.15. A lost element shows above.
    np.testing.assert_allclose(rd.launch_reduce(kernel, x), rd.reduce_reference(x),
                               rtol=1e-4, atol=2.0)


@pytest.mark.parametrize("kernel", [hg.histogram_kernel_v1, hg.histogram_kernel_v2],
                         ids=["v1", "v2"])
def test_histogram_large(kernel):
    x = _rng(6).integers(-5, 261, 5_000_011)
    np.testing.assert_array_equal(hg.launch_histogram(kernel, x, 256),
                                  hg.histogram_reference(x, 256))


def test_privatized_histogram_with_few_blocks():
    x = _rng(7).integers(0, 256, 5_000_011)
    got = hg.launch_histogram(hg.histogram_kernel_v2, x, 256, threads_per_block=256, blocks=264)
    np.testing.assert_array_equal(got, hg.histogram_reference(x, 256))


@pytest.mark.parametrize("kernel", [tp.transpose_kernel_v1, tp.transpose_kernel_v2,
                                    tp.transpose_kernel_v3], ids=["v1", "v2", "v3"])
@pytest.mark.parametrize("r, c", [(2048, 2048), (2049, 1023)])
def test_transpose_large(kernel, r, c):
    a = _rng(8).standard_normal((r, c)).astype(np.float32)
    np.testing.assert_array_equal(tp.launch_transpose(kernel, a), tp.transpose_reference(a))
