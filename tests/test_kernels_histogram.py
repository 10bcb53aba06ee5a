"""gpulab/kernels/histogram.py on the simulator: global-atomic and privatized histograms equal
np.bincount, with out-of-range values ignored, for any block count."""

import numpy as np
import pytest

from gpulab.kernels import histogram as hg

VERSIONS = [pytest.param(hg.histogram_kernel_v1, id="v1_global_atomics"),
            pytest.param(hg.histogram_kernel_v2, id="v2_privatized")]


def _values(n, n_bins, seed):
    # A few values fall outside [0, n_bins) on purpose: every version must skip them.
    return np.random.default_rng(seed).integers(-3, n_bins + 3, n)


@pytest.mark.parametrize("kernel", VERSIONS)
@pytest.mark.parametrize("n, n_bins", [(1, 1), (127, 10), (128, 37), (1000, 256)])
def test_histogram_matches_bincount(kernel, n, n_bins):
    x = _values(n, n_bins, seed=n + n_bins)
    got = hg.launch_histogram(kernel, x, n_bins)
    assert got.dtype == np.int32 and got.shape == (n_bins,)
    np.testing.assert_array_equal(got, hg.histogram_reference(x, n_bins))


@pytest.mark.parametrize("kernel", VERSIONS)
def test_histogram_with_every_element_in_one_bin(kernel):
    # The worst case for contention: every atomic goes to the same address.
    x = np.full(300, 5)
    np.testing.assert_array_equal(hg.launch_histogram(kernel, x, 8),
                                  hg.histogram_reference(x, 8))


@pytest.mark.parametrize("blocks", [1, 3])
def test_privatized_histogram_with_a_few_blocks(blocks):
    # Fewer threads than elements: v2's grid-stride loop visits the rest.
    x = _values(1000, 50, seed=blocks)
    got = hg.launch_histogram(hg.histogram_kernel_v2, x, 50, threads_per_block=64,
                              blocks=blocks)
    np.testing.assert_array_equal(got, hg.histogram_reference(x, 50))


def test_reference_ignores_out_of_range_values():
    counts = hg.histogram_reference(np.array([-1, 0, 2, 2, 3, 99]), n_bins=3)
    np.testing.assert_array_equal(counts, [1, 0, 2])


def test_launcher_rejects_too_many_bins():
    with pytest.raises(ValueError, match="n_bins"):
        hg.launch_histogram(hg.histogram_kernel_v1, np.zeros(4, int), hg.MAX_BINS + 1)


def test_napkin_math():
    n, n_bins = 10**6, 256
    assert hg.histogram_global_atomics(n, n_bins) == n  # v1: one per element
    assert hg.histogram_global_atomics(n, n_bins, blocks=8) == 8 * n_bins  # v2: one per bin
    assert hg.histogram_bytes(n, n_bins) == 4 * n + 4 * n_bins
