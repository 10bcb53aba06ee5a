"""gpulab.sim.run_traced: what it records (accesses, epochs, lines, names), the global-memory
traffic it counts, and that tracing leaves a kernel's results as the simulator computes them."""

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import cuda, float32, int32

from gpulab.sim import Access, KernelTimeout, OutOfBoundsError, run_traced

ROOT = Path(__file__).resolve().parents[1]
T = 4  # tile edge of the tiled matmul below


def line_of(kernel, snippet: str) -> int:
    """The file line number of the one line of `kernel` that contains `snippet`."""
    lines, first = inspect.getsourcelines(kernel.py_func)
    hits = [first + i for i, text in enumerate(lines) if snippet in text]
    assert len(hits) == 1, f"{snippet!r} is on {len(hits)} lines of {kernel.py_func.__name__}"
    return hits[0]


@cuda.jit
def double(out, x):
    i = cuda.grid(1)
    out[i] = x[i] * 2


@cuda.jit
def shift_left(out, x):
    buf = cuda.shared.array(4, float32)
    t = cuda.threadIdx.x
    buf[t] = x[t]
    cuda.syncthreads()
    out[t] = buf[(t + 1) % 4]


@cuda.jit
def two_on_one_line(out):
    lo, hi = cuda.shared.array(2, int32), cuda.shared.array(2, int32)
    t = cuda.threadIdx.x
    lo[t] = t
    hi[t] = 10 + t
    cuda.syncthreads()
    out[t] = lo[1 - t] + hi[1 - t]


@cuda.jit
def matmul_naive(c, a, b):
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for k in range(a.shape[1]):
        acc += a[row, k] * b[k, col]
    c[row, col] = acc


@cuda.jit
def matmul_tiled(c, a, b):
    a_tile = cuda.shared.array((T, T), float32)
    b_tile = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for t in range(a.shape[1] // T):
        a_tile[ty, tx] = a[row, t * T + tx]
        b_tile[ty, tx] = b[t * T + ty, col]
        cuda.syncthreads()
        for j in range(T):
            acc += a_tile[ty, j] * b_tile[j, tx]
        cuda.syncthreads()
    c[row, col] = acc


def matmul_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    return np.zeros((n, n), np.float32), a, b


# ----------------------------------------------------------------------------- accesses


def test_every_access_is_recorded_with_thread_line_and_epoch():
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    trace = run_traced(double, 2, 2, out, x)
    np.testing.assert_array_equal(out, 2 * x)
    line = line_of(double, "out[i] = x[i] * 2")
    want = []
    for i in range(4):  # block by block, thread by thread; each reads x[i], then writes out[i]
        block, thread = (i // 2,), (i % 2,)
        want.append((block, thread, "global", "x", (i,), "read", 0, line))
        want.append((block, thread, "global", "out", (i,), "write", 0, line))
    got = [(a.block, a.thread, a.space, a.array, a.index, a.kind, a.epoch, a.line)
           for a in trace.accesses]
    assert got == want
    assert trace.accesses[0] == Access((0,), (0,), "global", "x", (0,), "read", 0, line,
                                       "out[i] = x[i] * 2", inspect.getsourcefile(double.py_func))


def test_shared_arrays_are_named_after_their_variable_and_epochs_count_barriers():
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    trace = run_traced(shift_left, 1, 4, out, x)
    np.testing.assert_array_equal(out, np.roll(x, -1))
    shared = trace.accesses_to("buf")
    assert {a.space for a in shared} == {"shared"}
    assert [(a.thread, a.index, a.epoch) for a in shared if a.kind == "write"] == [
        ((t,), (t,), 0) for t in range(4)]
    assert [(a.thread, a.index, a.epoch) for a in shared if a.kind == "read"] == [
        ((t,), ((t + 1) % 4,), 1) for t in range(4)]
    assert trace.shared_bytes_written == trace.shared_bytes_read == 4 * 4


def test_two_shared_arrays_on_one_line_get_numbered_names_and_do_not_alias():
    out = np.zeros(2, np.int32)
    trace = run_traced(two_on_one_line, 1, 2, out)
    np.testing.assert_array_equal(out, [1 + 11, 0 + 10])  # the simulator would alias lo and hi
    assert [a.name for a in trace.arrays if a.space == "shared"] == ["shared#0", "shared#1"]
    assert trace.races == []


def test_tracing_gives_the_simulators_results():
    c, a, b = matmul_inputs(8)
    run_traced(matmul_tiled, (2, 2), (T, T), c, a, b)
    plain = np.zeros_like(c)
    matmul_tiled[(2, 2), (T, T)](plain, a, b)
    np.testing.assert_array_equal(c, plain)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_simulator_device_arrays_are_updated_in_place():
    d_out = cuda.to_device(np.zeros(4, np.float32))
    run_traced(double, 1, 4, d_out, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(d_out.copy_to_host(), [0, 2, 4, 6])


@cuda.jit
def row_sums(out, x):
    i = cuda.grid(1)
    row = x[i]  # a view of one row: its elements are still elements of x
    acc = 0.0
    for j in range(row.shape[0]):
        acc += row[j]
    out[i] = acc


def test_accesses_through_a_row_view_are_logged_against_the_whole_array():
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = np.zeros(2)
    trace = run_traced(row_sums, 1, 2, out, x)
    np.testing.assert_array_equal(out, [3, 12])
    assert [(a.thread, a.index) for a in trace.accesses_to("x")] == [
        ((t,), (t, j)) for t in range(2) for j in range(3)]
    with pytest.raises(OutOfBoundsError, match=r"thread 2 of block 0 reads x\[2\]"):
        run_traced(row_sums, 1, 3, np.zeros(3), x)


# ----------------------------------------------------------------------------- traffic


@pytest.mark.parametrize("n", [4, 8])
def test_traffic_of_naive_and_tiled_matmul_matches_hand_counts(n):
    """Naive: each of the n*n threads reads a row of A and a column of B (n elements each):
    n**3 reads of A and n**3 of B. Tiled: each block loads, per tile step, one T x T tile of A
    and one of B; (n/T)**2 blocks * (n/T) steps * T*T = n**3 / T reads of each. Both write C
    once. float32: 4 bytes an element."""
    c, a, b = matmul_inputs(n)
    naive = run_traced(matmul_naive, (n // T, n // T), (T, T), c, a, b)
    tiled = run_traced(matmul_tiled, (n // T, n // T), (T, T), np.zeros_like(c), a, b)
    assert naive.bytes_read_by_array == {"c": 0, "a": n**3 * 4, "b": n**3 * 4}
    assert naive.bytes_written_by_array == {"c": n * n * 4, "a": 0, "b": 0}
    assert naive.global_bytes_read == 2 * n**3 * 4
    assert tiled.bytes_read_by_array == {"c": 0, "a": n**3 // T * 4, "b": n**3 // T * 4}
    assert tiled.bytes_by_array == {"c": n * n * 4, "a": n**3 // T * 4, "b": n**3 // T * 4}
    assert tiled.global_bytes_written == naive.global_bytes_written == n * n * 4
    assert naive.global_bytes_read == T * tiled.global_bytes_read
    # the tiled kernel moves the reuse into shared memory: 2n reads per thread, 2 writes a step
    assert tiled.shared_bytes_read == 2 * n**3 * 4
    assert tiled.shared_bytes_written == 2 * n * n * (n // T) * 4


@cuda.jit
def count_into(counts, x):
    i = cuda.grid(1)
    cuda.atomic.add(counts, x[i], 1)


def test_atomics_are_recorded_and_count_as_a_read_and_a_write():
    x = np.array([0, 1, 1, 1], np.int32)
    counts = np.zeros(2, np.int32)
    trace = run_traced(count_into, 2, 2, counts, x)
    np.testing.assert_array_equal(counts, [1, 3])
    atomics = trace.accesses_to("counts", kind="atomic")
    assert [(a.block, a.thread, a.index) for a in atomics] == [
        ((0,), (0,), (0,)), ((0,), (1,), (1,)), ((1,), (0,), (1,)), ((1,), (1,), (1,))]
    assert trace.bytes_read_by_array == {"counts": 4 * 4, "x": 4 * 4}
    assert trace.bytes_written_by_array == {"counts": 4 * 4, "x": 0}


# ----------------------------------------------------------------------------- errors


@cuda.jit
def write_past_the_end(out):
    i = cuda.grid(1)
    out[i] = 1.0


def test_out_of_bounds_names_the_array_index_thread_and_line():
    line = line_of(write_past_the_end, "out[i] = 1.0")
    with pytest.raises(OutOfBoundsError) as info:
        run_traced(write_past_the_end, 2, 4, np.zeros(6))
    message = str(info.value)
    assert isinstance(info.value, IndexError)
    assert f"thread 2 of block 1 writes out[6] on line {line} (`out[i] = 1.0`)" in message
    assert "shape (6,)" in message and "0..5" in message


@cuda.jit
def divide_by_thread(out):
    t = cuda.threadIdx.x
    out[t] = 12 // (t - 2)


def test_an_exception_in_a_thread_reaches_the_caller_and_says_which_thread():
    with pytest.raises(ZeroDivisionError) as info:
        run_traced(divide_by_thread, 1, 4, np.zeros(4, np.int64))
    if hasattr(info.value, "__notes__"):
        assert "thread 2 of block 0" in info.value.__notes__[-1]


def test_the_kernel_sees_the_real_cuda_module_again_afterwards():
    with pytest.raises(OutOfBoundsError):
        run_traced(write_past_the_end, 1, 8, np.zeros(4))
    assert write_past_the_end.py_func.__globals__["cuda"] is cuda


def test_launch_configuration_is_checked_like_cuda():
    with pytest.raises(ValueError, match="at most 1024"):
        run_traced(double, 1, (32, 33), np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="blocks"):
        run_traced(double, 0, 4, np.zeros(4), np.zeros(4))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        run_traced(double, 1, 4, np.zeros(4))


# ----------------------------------------------------------------------------- the rest of cuda


@cuda.jit(device=True)
def plus_one(x, i):
    return x[i] + 1


def make_kernel_with_nested_device_functions():
    @cuda.jit(device=True)
    def twice_plus_one(x, i):
        return 2 * plus_one(x, i)  # a device function calling a global device function

    @cuda.jit
    def kernel(out, x):
        i = cuda.grid(1)
        out[i] = twice_plus_one(x, i)

    return kernel


def test_device_functions_run_traced_and_report_their_own_lines():
    kernel = make_kernel_with_nested_device_functions()
    out = np.zeros(3, np.float32)
    trace = run_traced(kernel, 1, 3, out, np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(out, [2, 4, 6])
    reads = trace.accesses_to("x", kind="read")
    assert {a.line for a in reads} == {inspect.getsourcelines(plus_one.py_func)[1] + 2}


@cuda.jit
def votes(out):
    t = cuda.threadIdx.x
    n_odd = cuda.syncthreads_count(t % 2)
    any_three = cuda.syncthreads_or(t == 3)
    all_small = cuda.syncthreads_and(t < 3)
    out[t] = 100 * n_odd + 10 * any_three + all_small


def test_syncthreads_votes_match_the_simulator():
    out, plain = np.zeros(5, np.int64), np.zeros(5, np.int64)
    trace = run_traced(votes, 1, 5, out)
    votes[1, 5](plain)
    np.testing.assert_array_equal(out, plain)
    np.testing.assert_array_equal(out, [210] * 5)
    assert {a.epoch for a in trace.accesses} == {3}


@cuda.jit
def rotate_dynamic(out, x):
    buf = cuda.shared.array(0, float32)  # sized by the launch
    t = cuda.threadIdx.x
    buf[t] = x[t]
    cuda.syncthreads()
    out[t] = buf[(t + 1) % cuda.blockDim.x]


def test_dynamic_shared_memory():
    out = np.zeros(4, np.float32)
    trace = run_traced(rotate_dynamic, 1, 4, out, np.arange(4, dtype=np.float32),
                       shared_bytes=16)
    np.testing.assert_array_equal(out, [1, 2, 3, 0])
    assert trace.array("buf").space == "shared"


@cuda.jit
def wait_for_flag(flag, out):
    t = cuda.threadIdx.x
    if t == 0:
        while flag[0] == 0:  # spins until thread 1 has run
            pass
        out[0] = 1
    if t == 1:
        flag[0] = 1


def test_a_thread_spinning_on_another_threads_flag_gets_to_finish():
    flag, out = np.zeros(1, np.int32), np.zeros(1, np.int32)
    trace = run_traced(wait_for_flag, 1, 2, flag, out)
    assert out[0] == 1
    assert [r.kind for r in trace.races] == ["read-write"]  # a plain flag is still a race


@cuda.jit
def wait_forever(flag):
    t = cuda.threadIdx.x
    if t == 0:
        while flag[0] == 0:  # thread 1 sets it only after a barrier thread 0 never reaches
            pass
    cuda.syncthreads()
    flag[0] = 1


def test_a_deadlocked_kernel_times_out_instead_of_hanging():
    with pytest.raises(KernelTimeout, match="thread 0 of block 0"):
        run_traced(wait_forever, 1, 2, np.zeros(1, np.int32), timeout_s=0.5)


# ----------------------------------------------------------------------------- a real GPU's numba


REAL_DRIVER_SCRIPT = textwrap.dedent("""
    import os, sys, types
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    from numba import cuda, float32
    assert not cuda.jit.__module__.startswith("numba.cuda.simulator")
    # gpulab/__init__ insists on the simulator without a GPU: load gpulab.sim on its own
    package = types.ModuleType("gpulab")
    package.__path__ = [sys.argv[1]]
    sys.modules["gpulab"] = package
    import numpy as np
    from gpulab.sim import run_traced

    @cuda.jit(device=True)
    def twice(v):
        return v * 2

    @cuda.jit
    def kernel(out, x):
        cache = cuda.shared.array(4, float32)
        t = cuda.threadIdx.x
        cache[t] = twice(x[cuda.grid(1)])
        cuda.syncthreads()
        cuda.atomic.add(out, 0, cache[3 - t])

    out = np.zeros(1, np.float32)
    trace = run_traced(kernel, 2, 4, out, np.arange(8, dtype=np.float32))
    print(type(kernel).__name__, float(out[0]), len(trace.races), trace.global_bytes_read)
""")


def test_traces_a_real_cuda_dispatcher_through_its_python_function():
    """Where numba.cuda is the real driver (a GPU machine), kernels are CUDADispatchers; the
    tracer runs their py_func. The driver is never touched, so this runs without a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", REAL_DRIVER_SCRIPT, str(ROOT / "gpulab")],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CUDADispatcher", "56.0", "0", str(8 * 4 + 8 * 4)]
