"""Lab 1's checkers pass a correct kernel and fail, with the message that teaches, on the known
wrong ones a learner writes: an off-by-one guard, no grid-stride loop, a start index without the
block, a stride longer than the grid, swapped indices, a missing barrier, a wrong tile index, no
atomics, lesson 02's kernel retyped where the lab asks for a variant, a launch plan whose numbers
or choice are wrong, gpulab's own kernel handed in."""

import math
import re
import sys

import numpy as np
import pytest
from grading_specs import LAB1 as SPEC
from lab_submissions import fails
from numba import cuda, float32

import gpulab
from gpulab.checks import lab1
from gpulab.checks.harness.kernels import SIMULATOR_SWITCH_INTERVAL_S, GuardedOutput, simulator_pace
from gpulab.checks.harness.owned import defined_in_library
from gpulab.checks.lab1 import config as lab1_config
from gpulab.checks.lab1 import waves as lab1_waves
from gpulab.kernels.histogram import histogram_kernel_v1
from gpulab.kernels.vector_add import saxpy_kernel_v1

pytestmark = pytest.mark.lab1

THREADS = lab1_config.BLOCK_SUM_THREADS
ITEMS = lab1_config.ITEMS_PER_THREAD
TILE = lab1_config.TILE
HALF = TILE // 2
needs_simulator = pytest.mark.skipif(not gpulab.runner.simulator,
                                     reason="the simulator raises IndexError on these")


# ----------------------------------------------------------------------------- Part 1


@cuda.jit
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = a * x[i] + y[i]
        i += cuda.gridsize(1)


@cuda.jit
def saxpy_guard_off_by_one(out, a, x, y):
    i = cuda.grid(1)
    while i <= out.size:
        out[i] = a * x[i] + y[i]
        i += cuda.gridsize(1)


@cuda.jit
def saxpy_one_pass(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def saxpy_swapped(out, a, x, y):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * y[i] + x[i]


@cuda.jit
def saxpy_start_thread_only(out, a, x, y):
    i = cuda.threadIdx.x  # the block left out: every block starts at element 0
    while i < out.size:
        out[i] = a * x[i] + y[i]
        i += cuda.gridsize(1)


@cuda.jit
def saxpy_start_thread_only_one_pass(out, a, x, y):
    i = cuda.threadIdx.x
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def saxpy_stride_too_long(out, a, x, y):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = a * x[i] + y[i]
        i += 2 * cuda.gridsize(1)


@cuda.jit
def saxpy_stops_early(out, a, x, y):
    i = cuda.grid(1)
    while i < out.size - 1:
        out[i] = a * x[i] + y[i]
        i += cuda.gridsize(1)


@cuda.jit
def saxpy_writes_nothing(out, a, x, y):
    i = cuda.grid(1)
    if i > out.size:
        out[i] = a * x[i] + y[i]


def test_saxpy_passes_a_correct_kernel():
    lab1.check_saxpy(saxpy, sizes=[1, 64, 1000])


def test_saxpy_catches_an_off_by_one_guard():
    with pytest.raises(AssertionError, match=r"i < n.*strictly less"):
        lab1.check_saxpy(saxpy_guard_off_by_one, sizes=[1000])


def test_saxpy_catches_a_missing_grid_stride_loop():
    blocks, tpb = lab1_config.GRID
    with pytest.raises(AssertionError, match=rf"^Only out\[0:{blocks * tpb}\] was written: the "
                                             rf"grid has {blocks} blocks x {tpb} threads"
                                             r".*cuda\.gridsize\(1\)"):
        lab1.check_saxpy(saxpy_one_pass, sizes=[5000])


def test_saxpy_without_the_loop_passes_when_the_grid_covers_n():
    """The visible sizes include one larger than the grid for this reason."""
    lab1.check_saxpy(saxpy_one_pass, sizes=[10])


def test_saxpy_names_swapped_operands():
    with pytest.raises(AssertionError, match="x and y are swapped"):
        lab1.check_saxpy(saxpy_swapped, sizes=[100])


def test_saxpy_names_a_start_index_without_the_block():
    """i = cuda.threadIdx.x: the blocks overlap. The hint is about the start, not the stride."""
    blocks, tpb = lab1_config.GRID
    grid = blocks * tpb
    with pytest.raises(AssertionError) as error:
        lab1.check_saxpy(saxpy_start_thread_only, sizes=[5000])
    assert re.match(rf"Only out\[0:{tpb}\], out\[{grid}:{grid + tpb}\], \.\.\. were written: "
                    rf"all {blocks} blocks wrote the same {tpb} elements\. Start at "
                    r"i = cuda\.grid\(1\) .*not cuda\.threadIdx\.x\.", str(error.value))
    assert "gridsize" not in str(error.value), "the stride was right: no word about it"


def test_saxpy_names_the_start_index_and_the_loop_when_both_are_missing():
    blocks, tpb = lab1_config.GRID
    with pytest.raises(AssertionError, match=rf"^Only out\[0:{tpb}\] was written: all {blocks} "
                                             rf"blocks wrote the same {tpb} elements\. Start at "
                                             r"i = cuda\.grid\(1\).*not cuda\.threadIdx\.x, "
                                             r"and step by cuda\.gridsize\(1\)"):
        lab1.check_saxpy(saxpy_start_thread_only_one_pass, sizes=[5000])


def test_saxpy_names_a_stride_longer_than_the_grid():
    grid = lab1_config.GRID[0] * lab1_config.GRID[1]
    with pytest.raises(AssertionError, match=rf"^out\[{grid}:{2 * grid}\] was never written: "
                                             rf"each thread stepped by {2 * grid}, not by the "
                                             rf"grid's {grid} threads"):
        lab1.check_saxpy(saxpy_stride_too_long, sizes=[5000])


def test_saxpy_names_a_loop_that_stops_early():
    with pytest.raises(AssertionError, match=r"^Only out\[0:999\] of 1000 elements was written: "
                                             r"the loop stopped early"):
        lab1.check_saxpy(saxpy_stops_early, sizes=[1000])


def test_saxpy_says_when_nothing_was_written():
    with pytest.raises(AssertionError, match=r"^No element of out was written"):
        lab1.check_saxpy(saxpy_writes_nothing, sizes=[100])


def test_gpulab_kernels_earn_no_points():
    with pytest.raises(AssertionError, match="define your own kernel in the notebook; importing "
                                             "gpulab's version earns no points"):
        lab1.check_saxpy(saxpy_kernel_v1)
    with pytest.raises(AssertionError, match="earns no points"):
        lab1.check_histogram(histogram_kernel_v1)
    # Re-wrapping gpulab's Python function keeps its code object: still refused.
    with pytest.raises(AssertionError, match="earns no points"):
        lab1.check_saxpy(cuda.jit(saxpy_kernel_v1.py_func))


def test_a_plain_function_is_not_a_kernel():
    with pytest.raises(AssertionError, match=r"not a CUDA kernel.*@cuda\.jit"):
        lab1.check_saxpy(saxpy.py_func)
    assert not defined_in_library(saxpy.py_func)
    assert defined_in_library(saxpy_kernel_v1.py_func)


@cuda.jit
def saxpy_stub(out, a, x, y):
    raise NotImplementedError()


@needs_simulator
def test_an_unfinished_stub_says_what_to_do():
    with pytest.raises(AssertionError, match=r"(?s)raised NotImplementedError.*Replace"):
        lab1.check_saxpy(saxpy_stub)


def test_a_write_past_the_end_is_reported_on_a_gpu_too():
    """On a GPU nothing raises IndexError: the write lands in the spare cells, found afterwards."""
    out = GuardedOutput((4, 3), np.float32, np.nan)
    host = out.buffer.copy_to_host()
    host[1, 3] = 7.0  # one column past the end of row 1
    out.buffer.copy_to_device(host)
    with pytest.raises(AssertionError, match=r"wrote past the end.*\[1, 3\].*\(4, 3\)"):
        out.result("kernel", "case")
    clean = GuardedOutput((5,), np.int32, 0)
    assert clean.result("kernel").tolist() == [0] * 5


def test_simulator_pace_restores_the_switch_interval():
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError), simulator_pace():
        if gpulab.runner.simulator:
            assert sys.getswitchinterval() == pytest.approx(SIMULATOR_SWITCH_INTERVAL_S)
        raise RuntimeError("a kernel failed")
    assert sys.getswitchinterval() == before


# ----------------------------------------------------------------------------- transpose

TILE_DIM, BLOCK_ROWS = lab1_config.TILE_DIM, lab1_config.BLOCK_ROWS


@cuda.jit
def transpose(out, a):
    tile = cuda.shared.array((TILE_DIM, TILE_DIM), float32)  # element (r, c) at [r, c ^ r]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, tx ^ (ty + j)] = a[y + j, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[tx, (ty + j) ^ tx]


@cuda.jit
def transpose_padded(out, a):
    """Lesson 02's transpose_kernel_v3, retyped: right, and the padding this part rules out."""
    tile = cuda.shared.array((TILE_DIM, TILE_DIM + 1), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, tx] = a[y + j, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[tx, ty + j]


@cuda.jit
def transpose_skew_read_back_plain(out, a):
    tile = cuda.shared.array((TILE_DIM, TILE_DIM), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, (tx + ty + j) % TILE_DIM] = a[y + j, x]  # skewed in ...
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[tx, ty + j]  # ... read back as if it were not


@cuda.jit
def transpose_one_row_each(out, a):
    tile = cuda.shared.array((TILE_DIM, TILE_DIM + 1), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    if y < a.shape[0] and x < a.shape[1]:  # one row per thread: 8 of the tile's 32
        tile[ty, tx] = a[y, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = tile[tx, ty]


@cuda.jit
def transpose_blocks_not_swapped(out, a):
    tile = cuda.shared.array((TILE_DIM, TILE_DIM + 1), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, tx] = a[y + j, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty  # not swapped
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[tx, ty + j]


@cuda.jit
def transpose_tile_row_stored(out, a):
    tile = cuda.shared.array((TILE_DIM, TILE_DIM + 1), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, tx] = a[y + j, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[ty + j, tx]  # the tile's row: blocks move, elements do not


def test_transpose_passes_a_correct_kernel():
    lab1.check_transpose(transpose, shapes=[(8, 24), (1, 19), (19, 1), (33, 40)])


def test_transpose_names_the_rows_a_thread_left_out():
    with pytest.raises(AssertionError, match=r"^Only the first 8 rows of each tile were written.*"
                                             r"each thread copies 4 rows"):
        lab1.check_transpose(transpose_one_row_each, shapes=[(24, 40)])


def test_transpose_names_block_indices_left_in_place():
    with pytest.raises(AssertionError, match=r"^It was never written.*the block indices swap"):
        lab1.check_transpose(transpose_blocks_not_swapped, shapes=[(13, 40)])


def test_transpose_names_a_tile_stored_by_rows():
    with pytest.raises(AssertionError, match=r"^Within a tile the elements are in the wrong "
                                             r"places: a thread writes to out's row the tile's "
                                             r"column.*More: gpulab\.hint\(\"lab1\", "
                                             r"\"transpose\"\)"):
        lab1.check_transpose(transpose_tile_row_stored, shapes=[(8, 24)])


def test_transpose_names_a_layout_read_back_differently_from_how_it_was_written():
    with pytest.raises(AssertionError, match=r"reads each element from where it was written"):
        lab1.check_transpose(transpose_skew_read_back_plain, shapes=[(8, 24)])


@cuda.jit
def transpose_skew_read_back_plain_from_nan(out, a):
    # The same mistake, where the cells no thread writes hold NaN (on the simulator, shared
    # memory starts as whatever np.empty gives: sometimes NaN), so some outputs read NaN.
    tile = cuda.shared.array((TILE_DIM, TILE_DIM), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        tile[ty + j, tx] = math.nan
    cuda.syncthreads()
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, (tx + ty + j) % TILE_DIM] = a[y + j, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[tx, ty + j]


def test_a_nan_copied_from_an_unwritten_tile_cell_is_not_called_never_written():
    with pytest.raises(AssertionError, match=r"reads each element from where it was written"):
        lab1.check_transpose(transpose_skew_read_back_plain_from_nan, shapes=[(8, 24)])


def test_transpose_on_a_square_within_one_tile_still_needs_the_column():
    """Why the lab's shapes are rectangles and cross tiles: each mistake shows on them."""
    lab1.check_transpose(transpose, shapes=[(6, 6)])
    with pytest.raises(AssertionError):
        lab1.check_transpose(transpose_tile_row_stored, shapes=[(6, 6)])


# Technique (tests/test_checks_lab1_technique.py has the other parts'): the simulator's trace.
TRACED = pytest.mark.skipif(not gpulab.runner.simulator,
                            reason="the trace is the cpu runner's evidence")


@cuda.jit
def transpose_unpadded(out, a):
    tile = cuda.shared.array((TILE_DIM, TILE_DIM), float32)  # a column is one bank
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TILE_DIM + tx, cuda.blockIdx.y * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            tile[ty + j, tx] = a[y + j, x]
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TILE_DIM + tx, cuda.blockIdx.x * TILE_DIM + ty
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < out.shape[0] and x < out.shape[1]:
            out[y + j, x] = tile[tx, ty + j]


@cuda.jit
def transpose_naive(out, a):
    x = cuda.blockIdx.x * TILE_DIM + cuda.threadIdx.x
    y = cuda.blockIdx.y * TILE_DIM + cuda.threadIdx.y
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            out[x, y + j] = a[y + j, x]  # a warp's stores land a row of out apart


@TRACED
def test_a_padded_tile_passes_both_checks():
    lab1.check_transpose(transpose)
    lab1.check_transpose_technique(transpose)


@TRACED
def test_a_naive_transpose_keeps_its_values_and_loses_the_technique():
    lab1.check_transpose(transpose_naive)
    text = fails(lab1.check_transpose_technique, transpose_naive,
                 r"^Stage the tile in shared memory.*stores `out` with 32\.0 sectors of 32 B per "
                 r"warp request, where coalesced stores take 4")
    assert "The values are right" in text


@TRACED
def test_an_unpadded_tile_is_named_by_its_bank_conflict():
    lab1.check_transpose(transpose_unpadded)
    fails(lab1.check_transpose_technique, transpose_unpadded,
          r"^Lay the tile out so that a column spans all 32 banks: .*took 32 passes \(a 32-way "
          r"bank conflict\)")


@TRACED
def test_lesson_02s_padded_tile_keeps_its_values_and_is_named_by_its_padding():
    lab1.check_transpose(transpose_padded)
    text = fails(lab1.check_transpose_technique, transpose_padded,
                 r"^Keep the tile at TILE_DIM x TILE_DIM floats, no padding: .* declares 4224 B "
                 r"of shared memory per block, and this part allows 4096 B")
    assert "The values are right" in text


# ----------------------------------------------------------------------------- Part 3


@cuda.jit
def block_sum(out, x):
    cache = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    total = float32(0.0)
    for k in range(ITEMS):
        i = cuda.blockIdx.x * ITEMS * THREADS + k * THREADS + t
        if i < x.size:
            total += x[i]
    cache[t] = total
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_no_barrier(out, x):
    cache = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    total = float32(0.0)
    for k in range(ITEMS):
        i = cuda.blockIdx.x * ITEMS * THREADS + k * THREADS + t
        if i < x.size:
            total += x[i]
    cache[t] = total
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_one_per_thread(out, x):
    """Lesson 02's reduce_kernel_v2 with its own output per block: one element per thread."""
    cache = cuda.shared.array(THREADS, float32)
    i, t = cuda.grid(1), cuda.threadIdx.x
    cache[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_first_items_only(out, x):
    cache = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * ITEMS * THREADS + t  # its first element, and none of the others
    cache[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_total(out, x):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, 0, x[i])


@cuda.jit
def block_sum_guard_off_by_one(out, x):
    cache = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    total = float32(0.0)
    for k in range(ITEMS):
        i = cuda.blockIdx.x * ITEMS * THREADS + k * THREADS + t
        if i <= x.size:
            total += x[i]
    cache[t] = total
    cuda.syncthreads()
    if t == 0:
        acc = 0.0
        for j in range(THREADS):
            acc += cache[j]
        out[cuda.blockIdx.x] = acc


def test_block_sum_passes_a_correct_kernel():
    lab1.check_block_sum(block_sum, sizes=[1, 64, 256, 1000])


def test_block_sum_race_check_passes_a_correct_kernel():
    lab1.check_block_sum_races(block_sum)


def test_block_sum_race_check_catches_a_missing_syncthreads():
    with pytest.raises(AssertionError, match=r"block_sum .*race"):
        lab1.check_block_sum_races(block_sum_no_barrier)


def test_block_sum_wants_one_sum_per_block():
    # out starts as NaN, so the atomic total lands in a NaN: out[0] is wrong and the rest unset
    with pytest.raises(AssertionError, match=r"block_sum, .*out\[0\]"):
        lab1.check_block_sum(block_sum_total, sizes=[600])


def test_lesson_02s_one_element_per_thread_is_named():
    with pytest.raises(AssertionError, match=r"^That is the sum of x\[0:64\], one element per "
                                             r"thread: here a block covers 256 elements, so each "
                                             r"of its 64 threads adds 4 of them"):
        lab1.check_block_sum(block_sum_one_per_thread, sizes=[1000])


def test_a_thread_that_adds_one_of_its_elements_is_named():
    with pytest.raises(AssertionError, match=r"^That is the sum of the block's first 64 elements "
                                             r"only: each thread adds 4 elements"):
        lab1.check_block_sum(block_sum_first_items_only, sizes=[1000])


@needs_simulator
def test_block_sum_catches_an_off_by_one_guard():
    with pytest.raises(AssertionError, match=r"(?s)IndexError.*i < n"):
        lab1.check_block_sum(block_sum_guard_off_by_one, sizes=[200])


# ----------------------------------------------------------------------------- Part 4


def two_outputs_matmul(step_k):
    """A tiled matmul with two outputs per thread whose step t loads the K-slice step_k(t, tx)
    of a: the right one is t * TILE + tx."""

    @cuda.jit
    def kernel(c, a, b, bias):
        a_tile = cuda.shared.array((TILE, TILE), float32)
        b_tile = cuda.shared.array((TILE, TILE), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        col, row = cuda.blockIdx.x * TILE + tx, cuda.blockIdx.y * TILE + ty
        top, bottom = float32(0.0), float32(0.0)
        for t in range((a.shape[1] + TILE - 1) // TILE):
            for r in range(ty, TILE, HALF):
                a_row, k = cuda.blockIdx.y * TILE + r, step_k(t, tx)
                a_tile[r, tx] = a[a_row, k] if a_row < a.shape[0] and k < a.shape[1] else 0.0
                k = t * TILE + r
                b_tile[r, tx] = b[k, col] if k < b.shape[0] and col < b.shape[1] else 0.0
            cuda.syncthreads()
            for j in range(TILE):
                top += a_tile[ty, j] * b_tile[j, tx]
                bottom += a_tile[ty + HALF, j] * b_tile[j, tx]
            cuda.syncthreads()
        if col < c.shape[1]:
            if row < c.shape[0]:
                c[row, col] = top + bias[col]
            if row + HALF < c.shape[0]:
                c[row + HALF, col] = bottom + bias[col]

    return kernel


@cuda.jit(device=True)
def _right_k(t, tx):
    return t * TILE + tx


@cuda.jit(device=True)
def _k_without_step(t, tx):
    return tx  # the step t forgotten: every step loads a's first tile


matmul_tiled = two_outputs_matmul(_right_k)
matmul_wrong_tile_index = two_outputs_matmul(_k_without_step)


@cuda.jit
def matmul_one_barrier(c, a, b, bias):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.blockIdx.x * TILE + tx, cuda.blockIdx.y * TILE + ty
    top, bottom = float32(0.0), float32(0.0)
    for t in range((a.shape[1] + TILE - 1) // TILE):
        for r in range(ty, TILE, HALF):
            a_row, k = cuda.blockIdx.y * TILE + r, t * TILE + tx
            a_tile[r, tx] = a[a_row, k] if a_row < a.shape[0] and k < a.shape[1] else 0.0
            k = t * TILE + r
            b_tile[r, tx] = b[k, col] if k < b.shape[0] and col < b.shape[1] else 0.0
        cuda.syncthreads()
        for j in range(TILE):
            top += a_tile[ty, j] * b_tile[j, tx]
            bottom += a_tile[ty + HALF, j] * b_tile[j, tx]
        # the barrier before the next loads is missing
    if col < c.shape[1]:
        if row < c.shape[0]:
            c[row, col] = top + bias[col]
        if row + HALF < c.shape[0]:
            c[row + HALF, col] = bottom + bias[col]


@cuda.jit
def matmul_one_output_per_thread(c, a, b, bias):
    """Lesson 02's matmul_kernel_v2 (with the bias), retyped: one output per thread."""
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for t in range((a.shape[1] + TILE - 1) // TILE):
        k = t * TILE + tx
        a_tile[ty, tx] = a[row, k] if row < a.shape[0] and k < a.shape[1] else 0.0
        k = t * TILE + ty
        b_tile[ty, tx] = b[k, col] if k < b.shape[0] and col < b.shape[1] else 0.0
        cuda.syncthreads()
        for j in range(TILE):
            acc += a_tile[ty, j] * b_tile[j, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc + bias[col]


@cuda.jit
def matmul_no_bias(c, a, b, bias):
    col = cuda.blockIdx.x * TILE + cuda.threadIdx.x
    for row in range(cuda.blockIdx.y * TILE + cuda.threadIdx.y, (cuda.blockIdx.y + 1) * TILE,
                     HALF):
        if row < c.shape[0] and col < c.shape[1]:
            acc = float32(0.0)
            for k in range(a.shape[1]):
                acc += a[row, k] * b[k, col]
            c[row, col] = acc


def test_matmul_tiled_passes_a_correct_kernel():
    lab1.check_matmul_tiled(matmul_tiled, shapes=[(8, 16, 8), (3, 10, 9)])


def test_matmul_tiled_catches_a_wrong_tile_index():
    with pytest.raises(AssertionError, match=r"^Check which tiles each step along K loads"):
        lab1.check_matmul_tiled(matmul_wrong_tile_index, shapes=[(8, 16, 8)])


def test_lesson_02s_one_output_per_thread_is_named_by_the_rows_it_leaves():
    with pytest.raises(AssertionError, match=r"^8 of c's 16 rows were never written: a block has 4 "
                                             r"rows of threads for a tile of 8 rows of c, so each "
                                             r"thread computes 2 outputs"):
        lab1.check_matmul_tiled(matmul_one_output_per_thread, shapes=[(16, 16, 8)])


def test_matmul_tiled_names_a_missing_bias():
    with pytest.raises(AssertionError, match="without the bias"):
        lab1.check_matmul_tiled(matmul_no_bias, shapes=[(3, 5, 4)])


def test_matmul_tiled_race_check():
    lab1.check_matmul_tiled_races(matmul_tiled)
    with pytest.raises(AssertionError, match=r"matmul_tiled .*race"):
        lab1.check_matmul_tiled_races(matmul_one_barrier)


# ----------------------------------------------------------------------------- Part 5


@cuda.jit
def histogram(counts, x, bin_width):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = x[i] // bin_width
        if b < counts.size:
            cuda.atomic.add(counts, b, 1)


@cuda.jit
def histogram_no_atomics(counts, x, bin_width):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = x[i] // bin_width
        if b < counts.size:
            counts[b] += 1


@cuda.jit
def histogram_guard_off_by_one(counts, x, bin_width):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        b = x[i] // bin_width
        if b <= counts.size:
            cuda.atomic.add(counts, b, 1)


@cuda.jit
def histogram_no_width(counts, x, bin_width):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        if x[i] < counts.size:
            cuda.atomic.add(counts, x[i], 1)


def test_histogram_passes_a_correct_kernel():
    lab1.check_histogram(histogram, sizes=[1, 500])
    lab1.check_histogram(histogram, sizes=[300], skewed=True)
    lab1.check_histogram_races(histogram)


def test_histogram_race_check_catches_missing_atomics():
    with pytest.raises(AssertionError, match=r"histogram .*race.*counts"):
        lab1.check_histogram_races(histogram_no_atomics)


def test_histogram_catches_an_off_by_one_guard():
    with pytest.raises(AssertionError, match=r"i < n"):
        lab1.check_histogram(histogram_guard_off_by_one, sizes=[500])


def test_histogram_names_a_missing_bin_width():
    with pytest.raises(AssertionError, match=r"v // bin_width"):
        lab1.check_histogram(histogram_no_width, sizes=[500])


# ----------------------------------------------------------------------------- Part 6


WAVES_WANT = lab1_waves.expected_waves(**lab1.WAVES_SETTING)


def l4_plan(tpb):
    """(blocks, blocks per SM, waves) on an L4 (58 SMs, 64 Ki registers, 100 KB of shared memory)
    for the lab's kernel, computed here from the notebook's numbers, not the checker's code."""
    per_sm = min(1536 // tpb, 24, 65536 // (48 * tpb), 102400 // (4096 + 32 * tpb))
    blocks = -(-1_000_000 // tpb)
    return blocks, per_sm, -(-blocks // (58 * per_sm))


def test_waves_accepts_every_block_size_with_the_fewest_waves():
    best = [tpb for tpb in range(32, 1025, 32) if l4_plan(tpb)[1] and l4_plan(tpb)[2] == 13]
    assert best == [96, 192, 224, 448, 672]
    assert WAVES_WANT["fewest_waves"] == 13 and WAVES_WANT["sms"] == 58
    for tpb in best:
        lab1.check_waves(tpb, *l4_plan(tpb), want=WAVES_WANT)
    lab1.check_waves(np.int64(96), np.float64(10417), 14, np.int32(13), want=WAVES_WANT)


def test_waves_names_a_plan_that_is_right_but_not_the_best():
    with pytest.raises(AssertionError, match=r"^Your plan's numbers are right, and it runs 14 "
                                             r"waves; some block sizes run it in 13\. It holds "
                                             r"5 x 256 = 1280 threads per SM \(the registers "
                                             r"bind\)"):
        lab1.check_waves(256, *l4_plan(256), want=WAVES_WANT)


def test_waves_names_the_limit_that_binds():
    with pytest.raises(AssertionError, match=r"^An SM holds what its tightest limit allows: "
                                             r"blocks_per_sm is 6, expected 5 .*threads 1536 // "
                                             r"256 = 6, blocks 24, registers 65536 // \(48 x "
                                             r"256\) = 5, shared memory 102400 // 12288 = 8: the "
                                             r"registers allow 5"):
        lab1.check_waves(256, 3907, 6, 12, want=WAVES_WANT)  # the threads' limit alone
    with pytest.raises(AssertionError, match=r"expected 16 .*the shared memory allow 16"):
        lab1.check_waves(64, 15625, 24, 12, want=WAVES_WANT)


def test_waves_refuses_a_block_size_that_cannot_fit_on_an_sm():
    heavy = lab1_waves.expected_waves(**{**lab1.WAVES_SETTING, "regs_per_thread": 128})
    with pytest.raises(AssertionError, match=r"^A block of 1024 threads cannot run on an L4 at "
                                             r"all: its registers allow 0 blocks per SM"):
        lab1.check_waves(1024, 977, 1, 1, want=heavy)


def test_waves_explains_wrong_plan_numbers():
    with pytest.raises(AssertionError, match=r"^One thread per element: blocks is 3906, expected "
                                             r"3907"):
        lab1.check_waves(256, 1_000_000 // 256, 5, 14, want=WAVES_WANT)
    with pytest.raises(AssertionError, match=r"n_waves is 13\.4.*expected 14.*round up"):
        lab1.check_waves(256, 3907, 5, 3907 / 290, want=WAVES_WANT)
    with pytest.raises(AssertionError, match=r"n_waves is 4, expected 14.*58 x 5 = 290 blocks"):
        lab1.check_waves(256, 3907, 5, 4, want=WAVES_WANT)
    with pytest.raises(AssertionError, match=r"threads_per_block is 100: .*a multiple of 32"):
        lab1.check_waves(100, 10000, 15, 12, want=WAVES_WANT)
    with pytest.raises(AssertionError, match=r"threads_per_block is 2048"):
        lab1.check_waves(2048, 489, 0, 1, want=WAVES_WANT)
    with pytest.raises(AssertionError, match="should be a number"):
        lab1.check_waves("96", 10417, 14, 13, want=WAVES_WANT)
    with pytest.raises(AssertionError, match="should be a number"):
        lab1.check_waves(96, None, 14, 13, want=WAVES_WANT)


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(mistake):
    """Each mistake that tests/grading_specs.py knows (tests/grading_checks.py grades some end to
    end): the solution with that mistake, run here up to its test cell, fails there, visible
    and hidden tests included, with the teaching message."""
    SPEC.expect_checker_teaches(mistake)
