"""gpulab.sim pictures: who touched which cell (as numbers, then drawn) and bytes per kernel."""

import matplotlib
import numpy as np
import pytest
from numba import cuda, float32

from gpulab.sim import draw_access, draw_traffic, run_traced, touch_grid, traffic_table

matplotlib.use("Agg")  # no window: the tests look at the figure objects

N = 4  # matrices are N x N, blocks (2, 2) of (2, 2) threads


@cuda.jit
def matmul_naive(c, a, b):
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for k in range(a.shape[1]):
        acc += a[row, k] * b[k, col]
    c[row, col] = acc


@pytest.fixture(scope="module")
def trace():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((N, N)).astype(np.float32)
    b = rng.standard_normal((N, N)).astype(np.float32)
    return run_traced(matmul_naive, (2, 2), (2, 2), np.zeros((N, N), np.float32), a, b)


def test_touch_grid_tells_which_block_and_thread_wrote_each_cell(trace):
    rows, cols = np.indices((N, N))
    # c[row, col] is written by block (col // 2, row // 2), thread (col % 2, row % 2);
    # linear ids count x fastest: block x + 2 * y, thread x + 2 * y
    np.testing.assert_array_equal(touch_grid(trace, "c", kind="write", by="block"),
                                  cols // 2 + 2 * (rows // 2))
    np.testing.assert_array_equal(trace.touch_grid("c", kind="write", by="thread"),
                                  cols % 2 + 2 * (rows % 2))
    np.testing.assert_array_equal(touch_grid(trace, "c", kind="read"), -np.ones((N, N)))


def test_touch_grid_counts_the_reuse_of_a_naive_matmul(trace):
    # a[row, k] is read by the N threads of its row (one per column of C), once each
    np.testing.assert_array_equal(touch_grid(trace, "a", by="count"), np.full((N, N), N))
    np.testing.assert_array_equal(touch_grid(trace, "a", by="threads"), np.full((N, N), N))
    # within block (1, 0) (columns 2-3, rows 0-1 of C) only rows 0-1 of A are read
    only = touch_grid(trace, "a", by="count", block=(1, 0))
    np.testing.assert_array_equal(only[:2], np.full((2, N), 2))
    np.testing.assert_array_equal(only[2:], np.zeros((2, N)))
    with pytest.raises(ValueError, match="by="):
        touch_grid(trace, "a", by="warp")
    with pytest.raises(KeyError, match="no array called 'z'"):
        touch_grid(trace, "z")


def test_draw_access_draws_one_grid_or_one_panel_per_block(trace):
    import matplotlib.pyplot as plt

    fig = draw_access(trace, "c", kind="write", by="block")
    assert len(fig.axes) == 1 and "c, writes by block" in fig.axes[0].get_title()
    assert len(fig.axes[0].texts) == N * N  # small grids are labelled cell by cell
    plt.close(fig)
    fig = trace.draw_access("a", by="count")
    assert len(fig.axes) == 2  # the grid and its colorbar
    plt.close(fig)
    fig = draw_access(trace, "c", per_block=True)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["block (0, 0)", "block (1, 0)", "block (0, 1)", "block (1, 1)"]
    plt.close(fig)


def test_traffic_table_and_bars_compare_kernels(trace):
    import matplotlib.pyplot as plt

    twice = {"naive": trace, "again": trace}
    text = traffic_table(twice)
    lines = text.splitlines()
    assert lines[0].split() == ["kernel", "read", "(B)", "written", "(B)", "total", "(B)",
                                "vs", "first"]
    read, written = 2 * N**3 * 4, N * N * 4
    assert lines[2].split() == ["naive", f"{read:,}", f"{written:,}", f"{read + written:,}",
                                "1x"]
    fig = draw_traffic(twice)
    bars = [p.get_height() for p in fig.axes[0].patches]
    assert bars == [read / 1024, read / 1024, written / 1024, written / 1024]
    plt.close(fig)
