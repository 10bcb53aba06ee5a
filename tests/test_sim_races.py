"""gpulab.sim race and barrier checks: each buggy kernel gets the exact report (array, index,
threads, kind, lines), every time, and correct kernels pass."""

import inspect

import numpy as np
import pytest
from numba import cuda, float32

from gpulab.sim import (
    DivergentBarrier,
    RaceError,
    check_no_races,
    explain,
    find_races,
    run_traced,
)

N_THREADS = 8  # threads per block of the reductions
T = 4  # tile edge of the tiled matmuls


def line_of(kernel, snippet: str) -> int:
    """The file line number of the one line of `kernel` that contains `snippet`."""
    lines, first = inspect.getsourcelines(kernel.py_func)
    hits = [first + i for i, text in enumerate(lines) if snippet in text]
    assert len(hits) == 1, f"{snippet!r} is on {len(hits)} lines of {kernel.py_func.__name__}"
    return hits[0]


def summary(race):
    """The parts of a Race a learner reads: kind, element, who and where."""
    return (race.kind, race.array, race.index, race.first.block, race.first.thread,
            race.first.line, race.second.block, race.second.thread, race.second.line)


# ----------------------------------------------------------------------------- reductions


@cuda.jit
def block_sum(out, x):
    cache = cuda.shared.array(N_THREADS, float32)
    t = cuda.threadIdx.x
    cache[t] = x[cuda.grid(1)]
    cuda.syncthreads()
    stride = N_THREADS // 2
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_no_barriers(out, x):
    cache = cuda.shared.array(N_THREADS, float32)
    t = cuda.threadIdx.x
    cache[t] = x[cuda.grid(1)]
    stride = N_THREADS // 2
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = cache[0]


def test_a_correct_shared_memory_reduction_has_no_races():
    x = np.arange(2 * N_THREADS, dtype=np.float32)
    out = np.zeros(2, np.float32)
    trace = run_traced(block_sum, 2, N_THREADS, out, x)
    np.testing.assert_array_equal(out, x.reshape(2, -1).sum(axis=1))
    assert trace.races == [] and trace.barrier_errors == []
    check_no_races(block_sum, 2, N_THREADS, np.zeros(2, np.float32), x)


def test_the_reduction_without_syncthreads_reports_each_element_read_too_early():
    """Thread k stores cache[k] on the store line; thread t < stride reads cache[t + stride]
    on the += line, with no barrier in between. Element k (1..7) is first read by the lowest
    such t; thread 0 alone touches cache[0]. Per block, so 2 * 7 races."""
    x = np.arange(2 * N_THREADS, dtype=np.float32)
    races = find_races(block_sum_no_barriers, 2, N_THREADS, np.zeros(2, np.float32), x)
    store = line_of(block_sum_no_barriers, "cache[t] = x[")
    add = line_of(block_sum_no_barriers, "cache[t] += cache[t + stride]")
    reader = {t + stride: t for stride in (4, 2, 1) for t in range(stride)}  # one each
    assert sorted(reader) == list(range(1, N_THREADS))
    want = [("write-read", "cache", (k,), (b,), (k,), store, (b,), (reader[k],), add)
            for b in range(2) for k in range(1, N_THREADS)]
    assert [summary(r) for r in races] == want
    assert {r.space for r in races} == {"shared"}


def test_the_race_error_reads_like_a_teacher():
    x = np.arange(2 * N_THREADS, dtype=np.float32)
    store = line_of(block_sum_no_barriers, "cache[t] = x[")
    add = line_of(block_sum_no_barriers, "cache[t] += cache[t + stride]")
    with pytest.raises(RaceError) as info:
        check_no_races(block_sum_no_barriers, 2, N_THREADS, np.zeros(2, np.float32), x)
    message = str(info.value)
    assert "data race on 14 element(s) of `cache` (shared)" in message
    assert (f"cache[1]: thread 1 of block 0 writes it on line {store} (`cache[t] = "
            f"x[cuda.grid(1)]`), and thread 0 of block 0 reads it on line {add}") in message
    assert f"A cuda.syncthreads() between the write on line {store} and the read on line {add}?"\
        in message
    assert "(the same on 13 more element(s) of cache)" in message
    assert len(info.value.races) == 14 and info.value.barrier_errors == []


def test_reports_are_the_same_on_every_run():
    x = np.arange(2 * N_THREADS, dtype=np.float32)
    outs, reports = [], []
    for _ in range(3):
        out = np.zeros(2, np.float32)
        reports.append(find_races(block_sum_no_barriers, 2, N_THREADS, out, x))
        outs.append(out)
    assert reports[0] == reports[1] == reports[2]
    np.testing.assert_array_equal(outs[0], outs[1])


# ----------------------------------------------------------------------------- tiled matmul


@cuda.jit
def tiled(c, a, b):
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for t in range(a.shape[1] // T):
        sa[ty, tx] = a[row, t * T + tx]
        sb[ty, tx] = b[t * T + ty, col]
        cuda.syncthreads()
        for j in range(T):
            acc += sa[ty, j] * sb[j, tx]
        cuda.syncthreads()
    c[row, col] = acc


@cuda.jit
def tiled_no_second_barrier(c, a, b):
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for t in range(a.shape[1] // T):
        sa[ty, tx] = a[row, t * T + tx]
        sb[ty, tx] = b[t * T + ty, col]
        cuda.syncthreads()
        for j in range(T):
            acc += sa[ty, j] * sb[j, tx]
    c[row, col] = acc


def matmul_inputs(n):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    return np.zeros((n, n), np.float32), a, b


def test_a_correct_2d_tiled_matmul_has_no_races():
    c, a, b = matmul_inputs(8)
    check_no_races(tiled, (2, 2), (T, T), c, a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_missing_barrier_after_the_tile_use_is_a_write_after_read_race():
    """With 2 tile steps, step 1's loads overwrite tiles that other threads still read from
    step 0: sa[ty, k] is read by threads (x, ty) and rewritten by thread (k, ty), sb[k, tx]
    read by (tx, y) and rewritten by (tx, k). Every element of both tiles in all 4 blocks."""
    c, a, b = matmul_inputs(8)
    races = find_races(tiled_no_second_barrier, (2, 2), (T, T), c, a, b)
    use = line_of(tiled_no_second_barrier, "acc += sa[ty, j] * sb[j, tx]")
    load_a = line_of(tiled_no_second_barrier, "sa[ty, tx] = a[")
    load_b = line_of(tiled_no_second_barrier, "sb[ty, tx] = b[")
    assert len(races) == 2 * 4 * T * T
    assert {(r.array, r.kind, r.lines) for r in races} == {
        ("sa", "read-write", (use, load_a)), ("sb", "read-write", (use, load_b))}
    assert {r.first.epoch for r in races} == {1}  # after the first barrier, before any other
    first_sa = next(r for r in races if r.array == "sa")
    # thread (0, 0) runs first: it reads row 0 of sa, then loads the next tile's sa[0, 0];
    # thread (1, 0) then reads sa[0, 0] too late. Its read is first in program order.
    assert summary(first_sa) == ("read-write", "sa", (0, 0), (0, 0), (1, 0), use,
                                 (0, 0), (0, 0), load_a)
    for r in races:  # the writer of sa[i, j] is thread (j, i); of sb[i, j], thread (j, i)
        assert r.second.thread == (r.index[1], r.index[0]) and r.second.kind == "write"
        assert r.first.thread != r.second.thread and r.first.block == r.second.block
    with pytest.raises(RaceError, match="belongs at the end of the loop body"):
        check_no_races(tiled_no_second_barrier, (2, 2), (T, T), c, a, b)


# ----------------------------------------------------------------------------- global memory


@cuda.jit
def sum_plain(out, x):
    out[0] += x[cuda.grid(1)]


@cuda.jit
def sum_atomic(out, x):
    cuda.atomic.add(out, 0, x[cuda.grid(1)])


@cuda.jit
def last_writer_wins(out, x):
    out[0] = x[cuda.grid(1)]


def test_every_thread_adding_into_out0_without_atomics_is_one_race():
    """Thread 0 reads and writes out[0]; thread 1 then reads it in the same barrier interval.
    Thread 1's read comes earlier in its program (2nd access) than thread 0's write (3rd)."""
    x = np.ones(8, np.float32)
    races = find_races(sum_plain, 2, 4, np.zeros(1, np.float32), x)
    line = line_of(sum_plain, "out[0] += x[")
    assert [summary(r) for r in races] == [
        ("read-write", "out", (0,), (0,), (1,), line, (0,), (0,), line)]
    assert races[0].space == "global"
    with pytest.raises(RaceError, match=r"Use cuda\.atomic\.add on out\[0\]"):
        check_no_races(sum_plain, 2, 4, np.zeros(1, np.float32), x)


def test_atomics_do_not_race():
    x = np.arange(8, dtype=np.float32)
    out = np.zeros(1, np.float32)
    check_no_races(sum_atomic, 2, 4, out, x)
    assert out[0] == x.sum()


def test_two_blocks_writing_one_element_race_across_blocks():
    line = line_of(last_writer_wins, "out[0] = x[")
    races = find_races(last_writer_wins, 2, 1, np.zeros(1, np.float32), np.ones(2, np.float32))
    assert [summary(r) for r in races] == [
        ("write-write", "out", (0,), (0,), (0,), line, (1,), (0,), line)]
    assert not races[0].same_block
    with pytest.raises(RaceError, match="Several threads write out\\[0\\] on the same line"):
        check_no_races(last_writer_wins, 2, 1, np.zeros(1, np.float32), np.ones(2, np.float32))


@cuda.jit
def count_then_reset(out):
    cuda.atomic.add(out, 0, 1)
    if cuda.threadIdx.x == 3:
        out[0] = 0  # a plain write races with the other threads' atomics


def test_a_plain_write_races_with_atomics():
    add = line_of(count_then_reset, "cuda.atomic.add(out, 0, 1)")
    reset = line_of(count_then_reset, "out[0] = 0")
    races = find_races(count_then_reset, 1, 4, np.zeros(1, np.int64))
    assert [summary(r) for r in races] == [
        ("atomic-write", "out", (0,), (0,), (0,), add, (0,), (3,), reset)]
    with pytest.raises(RaceError, match="make every update atomic"):
        check_no_races(count_then_reset, 1, 4, np.zeros(1, np.int64))


# ----------------------------------------------------------------------------- barriers


@cuda.jit
def barrier_inside_if(out):
    t = cuda.threadIdx.x
    if t < 4:
        cuda.syncthreads()
    out[t] = t


@cuda.jit
def early_return(out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    cuda.syncthreads()
    out[i] = i


@cuda.jit
def barriers_in_both_branches(out):
    t = cuda.threadIdx.x
    if t % 2 == 0:
        cuda.syncthreads()
    else:
        cuda.syncthreads()
    out[t] = t


def test_the_simulator_itself_lets_a_divergent_barrier_pass():
    """Why the check exists: the simulator releases a barrier once every *live* thread waits,
    so this kernel, undefined on a GPU, finishes there without a word."""
    out = np.zeros(8)
    barrier_inside_if[1, 8](out)
    np.testing.assert_array_equal(out, np.arange(8))


def test_a_barrier_inside_an_if_is_reported_not_hung():
    line = line_of(barrier_inside_if, "cuda.syncthreads()")
    out = np.zeros(8)
    trace = run_traced(barrier_inside_if, 1, 8, out)
    np.testing.assert_array_equal(out, np.arange(8))
    assert trace.races == []
    assert trace.barrier_errors == [DivergentBarrier(
        block=(0,), barrier=0, waiting=((line, ((0,), (1,), (2,), (3,))),),
        exited=((4,), (5,), (6,), (7,)))]
    with pytest.raises(RaceError) as info:
        check_no_races(barrier_inside_if, 1, 8, np.zeros(8))
    message = str(info.value)
    assert (f"threads 0-3 wait at the cuda.syncthreads() on line {line}, but threads 4-7 "
            "finished the kernel without it") in message
    assert "Every thread of a block must reach every cuda.syncthreads()" in message


def test_an_early_return_before_a_barrier_is_reported_per_block():
    line = line_of(early_return, "cuda.syncthreads()")
    trace = run_traced(early_return, 2, 4, np.zeros(8), 6)
    assert trace.barrier_errors == [DivergentBarrier(
        block=(1,), barrier=0, waiting=((line, ((0,), (1,))),), exited=((2,), (3,)))]


def test_threads_waiting_at_different_barriers_are_reported():
    even = line_of(barriers_in_both_branches, "if t % 2 == 0:") + 1
    odd = even + 2
    trace = run_traced(barriers_in_both_branches, 1, 4, np.zeros(4))
    assert trace.barrier_errors == [DivergentBarrier(
        block=(0,), barrier=0, waiting=((even, ((0,), (2,))), (odd, ((1,), (3,)))), exited=())]
    with pytest.raises(RaceError, match="Threads wait at different barriers"):
        check_no_races(barriers_in_both_branches, 1, 4, np.zeros(4))


# ----------------------------------------------------------------------------- the message


@cuda.jit
def four_kinds_of_race(a, b, c, d):
    a[0] = 1
    b[0] = 1
    c[0] = 1
    d[0] = 1


def test_the_message_shows_a_few_kinds_and_counts_the_rest():
    arrays = [np.zeros(1) for _ in range(4)]
    trace = run_traced(four_kinds_of_race, 1, 2, *arrays)
    message = explain(trace.kernel_name, trace.races)
    assert [r.array for r in trace.races] == ["a", "b", "c", "d"]
    assert "a[0]:" in message and "c[0]:" in message and "d[0]:" not in message
    assert "... and 1 more race(s) of 1 other kind(s)" in message


@cuda.jit
def _tree_sum_missing_loop_barrier(out, x):
    cache = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    cache[t] = x[t]
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            cache[t] += cache[t + stride]
        stride //= 2
    if t == 0:
        out[0] = cache[0]


@cuda.jit
def _histogram_plain_increment(counts, x):
    i = cuda.grid(1)
    if i < x.size:
        counts[x[i]] += 1


def test_hint_tells_a_missing_barrier_from_a_lost_update():
    out, x = np.zeros(1, np.float32), np.ones(64, np.float32)
    races = find_races(_tree_sum_missing_loop_barrier, 1, 64, out, x)
    assert races and not races[0].lost_update
    text = explain("tree", races)
    assert "cuda.syncthreads()" in text and "atomic" not in text

    races = find_races(_histogram_plain_increment, 2, 32, np.zeros(4, np.int32),
                       np.zeros(64, np.int32))
    assert races and races[0].lost_update
    assert "Use cuda.atomic.add on counts[0]" in explain("histogram", races)
