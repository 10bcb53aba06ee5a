"""gpulab.sim.portable: a kernel packed and unpacked traces as the original does, with the same
counts, the same lines and the same loop turns; what cannot travel is named."""

import threading

import numpy as np
import pytest
from numba import cuda, float32

import gpulab
from gpulab.sim import count, run_traced
from gpulab.sim.portable import NotPortable, pack_kernel, unpack_kernel

pytestmark = pytest.mark.skipif(not gpulab.runner.simulator, reason="unpacks on the simulator")

WIDTH = 32


@cuda.jit(device=True)
def _scaled(value, factor):
    return value * factor


def make_kernel(factor):
    @cuda.jit
    def guarded_sum(out, x):
        cache = cuda.shared.array(WIDTH, float32)
        t = cuda.threadIdx.x
        total = float32(0.0)
        for k in range(t, x.size, WIDTH):  # threads of one warp make different turns
            if k % 3 != 0:
                total += _scaled(x[k], factor)
        cache[t] = total
        cuda.syncthreads()
        if t == 0:
            for j in range(WIDTH):
                out[0] += cache[j]

    return guarded_sum


def test_an_unpacked_kernel_traces_like_the_original():
    kernel = make_kernel(2.0)
    x = np.arange(100, dtype=np.float32)
    copy = unpack_kernel(pack_kernel(kernel))
    outs = [np.zeros(1, np.float32), np.zeros(1, np.float32)]
    traces = [run_traced(k, 1, WIDTH, out, x) for k, out in zip((kernel, copy), outs,
                                                                 strict=True)]
    assert outs[0][0] == outs[1][0] == 2 * sum(v for v in range(100) if v % 3)
    assert count(traces[0]) == count(traces[1])
    lines = [[(a.line, a.code) for a in t.accesses[:40]] for t in traces]
    assert lines[0] == lines[1] and "cache[t] = total" in {code for _, code in lines[0]}


def test_what_cannot_be_pickled_is_named():
    lock = threading.Lock()

    @cuda.jit
    def reads_a_lock(out):
        if lock is None:
            out[0] = 1.0

    with pytest.raises(NotPortable, match=r"`lock` of reads_a_lock .* is a lock"):
        pack_kernel(reads_a_lock)
