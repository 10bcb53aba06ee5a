"""gpulab.sim.count on skip-and-rejoin: threads of a warp that skip an access on one turn of a
loop and make it on a later one. A warp runs the k-th turn of its threads together, so each
turn is a request of its own; every count below is worked out by hand in the comments."""

import importlib.util
import linecache
import sys

import numpy as np
from numba import cuda, float32

from gpulab.sim import count, run_traced
from gpulab.sim.cost import SECTOR_BYTES


@cuda.jit
def guard_in_uneven_loop(out, x):
    t = cuda.threadIdx.x
    acc = float32(0.0)
    for k in range(t % 4 + 1):  # thread t makes t % 4 + 1 turns...
        if (t + k) % 2 == 0:  # ...and skips every other one
            acc += x[k * 32 + t]
    out[t] = acc


@cuda.jit(device=True)
def load_if(x, i, take):
    if take:
        return x[i]
    return float32(0.0)


@cuda.jit
def guard_in_a_device_function(out, x):
    t = cuda.threadIdx.x
    acc = float32(0.0)
    for k in range(t % 4 + 1):  # the same turns, the access one call down
        acc += load_if(x, k * 32 + t, (t + k) % 2 == 0)
    out[t] = acc


@cuda.jit
def lowest_bit_tree(out, x):
    buf = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    buf[t] = x[t]
    buf[t + 32] = x[t + 32]
    cuda.syncthreads()
    acc = float32(0.0)
    for step in range(5):
        stride = 1 << step
        if t % (2 * stride) == stride:  # idle until the step of my lowest set bit
            acc += buf[2 * t]
    out[t] = acc


@cuda.jit
def two_halves(out, x):
    t = cuda.threadIdx.x
    for half in range(2):
        if t // 16 == half:  # the first half of the warp on turn 0, the second on turn 1
            out[t] = x[t]


@cuda.jit
def while_turns(out, x):
    t = cuda.threadIdx.x
    k = 0
    while k < 3:
        if (t + k) % 3 == 0:  # each thread works on exactly one of the three turns
            out[t] += x[t]
        k += 1


def counted(kernel, *args):
    return count(run_traced(kernel, 1, 32, *args))


def test_a_guard_in_a_loop_of_uneven_length_is_a_request_per_turn():
    # Turn k runs in the threads with t % 4 >= k; of those, the ones with t + k even load.
    #   k=0: even t (16 threads)   k=1: odd t (16)   k=2: t % 4 == 2 (8)   k=3: t % 4 == 3 (8)
    # Each turn's loads lie in x[32k : 32k + 32]: 4 sectors, touched by every turn.
    # Counting by each thread's n-th load would put turns 0 and 1 in one request, 2 and 3 in
    # another: 2 requests where the warp issues 4.
    c = counted(guard_in_uneven_loop, np.zeros(32, np.float32), np.ones(128, np.float32))
    assert (c.global_load_requests, c.global_load_sectors) == (4, 16)
    assert (c.global_store_requests, c.global_store_sectors) == (1, 4)
    assert c.global_bytes_used == (16 + 16 + 8 + 8) * 4 + 32 * 4


def test_a_loop_turn_lines_up_accesses_made_in_a_device_function():
    c = counted(guard_in_a_device_function, np.zeros(32, np.float32), np.ones(128, np.float32))
    assert (c.global_load_requests, c.global_load_sectors) == (4, 16)


def test_a_tree_whose_threads_idle_until_their_step_takes_a_request_per_step():
    # Step s: the threads whose lowest set bit is s read buf[2t] (words 2t, stride 2):
    #   s=0: t = 1, 3, ..., 31: banks 2t % 32 hit by t and t + 16, 2 words each: 2 passes
    #   s=1: t = 2, 6, ..., 30: t and t + 16 again share a bank:               2 passes
    #   s=2: t = 4, 12, 20, 28: words 8, 24, 40, 56 in banks 8, 24, 8, 24:       2 passes
    #   s=3: t = 8, 24: words 16 and 48, both bank 16:                           2 passes
    #   s=4: t = 16: word 32:                                                    1 pass
    # plus the two conflict-free stores buf[t], buf[t + 32]: 7 requests, 11 passes. Each
    # thread reads once, so counting by n-th read would make one request of all 31 readers
    # (2 passes): 3 requests and 4 passes.
    c = counted(lowest_bit_tree, np.zeros(32, np.float32), np.ones(64, np.float32))
    assert (c.shared_requests, c.shared_passes, c.worst_bank_conflict) == (7, 11, 2)
    assert (c.global_load_requests, c.global_load_sectors) == (2, 8)


def test_two_halves_of_a_warp_on_two_turns_are_two_requests():
    # x[0:16] and x[16:32] are 2 sectors each; one turn each: 2 loads and 2 stores.
    c = counted(two_halves, np.zeros(32, np.float32), np.ones(32, np.float32))
    assert (c.global_load_requests, c.global_load_sectors) == (2, 4)
    assert (c.global_store_requests, c.global_store_sectors) == (2, 4)
    assert c.global_bytes == 8 * SECTOR_BYTES


def test_the_turns_of_a_while_loop_count_like_a_for_loop():
    # 3 turns, a third of the warp on each: `out[t] += x[t]` loads out and x, stores out.
    c = counted(while_turns, np.zeros(32, np.float32), np.ones(32, np.float32))
    assert (c.global_load_requests, c.global_store_requests) == (6, 3)


def test_the_traced_copy_computes_what_the_kernel_computes():
    x = np.arange(128, dtype=np.float32)
    out = np.zeros(32, np.float32)
    run_traced(guard_in_uneven_loop, 1, 32, out, x)
    t = np.arange(32)
    want = [sum(x[k * 32 + i] for k in range(i % 4 + 1) if (i + k) % 2 == 0) for i in t]
    np.testing.assert_allclose(out, want)


def test_a_kernel_without_source_is_counted_by_nth_execution():
    """Code compiled from a string has no source to copy: the launch runs it as it is, and an
    access's n-th execution stands in for its loop turn (the counts without skip-and-rejoin)."""
    namespace = {"cuda": cuda}
    exec(compile("def copy_all(out, x):\n"
                 "    t = cuda.threadIdx.x\n"
                 "    for k in range(2):\n"
                 "        out[k * 32 + t] = x[k * 32 + t]\n", "<no file>", "exec"), namespace)
    trace = run_traced(cuda.jit(namespace["copy_all"]), 1, 32, np.zeros(64, np.float32),
                       np.ones(64, np.float32))
    assert {record[-1] for record in trace.records} == {None}
    c = count(trace)
    assert (c.global_load_requests, c.global_load_sectors) == (2, 8)


def test_source_that_is_not_the_code_that_runs_is_not_copied(tmp_path):
    """The copy is made from the source file; when the file says something else than the code
    (edited since, or written to mislead), the launch runs the code itself."""
    path = tmp_path / "shifty_kernel.py"
    path.write_text("from numba import cuda\n\n\n@cuda.jit\ndef scale(out, x):\n"
                    "    t = cuda.threadIdx.x\n    for k in range(2):\n"
                    "        out[t] = x[t] * 3\n")
    spec = importlib.util.spec_from_file_location("shifty_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.write_text(path.read_text().replace("* 3", "* 2"))  # same bytecode, another constant
    linecache.checkcache(str(path))
    out = np.zeros(32, np.float32)
    trace = run_traced(module.scale, 1, 32, out, np.ones(32, np.float32))
    np.testing.assert_allclose(out, 3.0)  # what the code says, not the file
    assert {record[-1] for record in trace.records} == {None}
    sys.modules.pop("shifty_kernel", None)
