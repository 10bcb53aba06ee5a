"""Lab 1, Part 2: a shared-memory tree reduction per block (check_block_sum, check_block_sum_races,
and check_block_sum_technique: a tree, not one thread adding the block).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import gpulab
from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.harness.technique import measured_speedup, require_tree, trace_kernel
from gpulab.checks.lab1.config import (
    BLOCK_SUM_THREADS,
)
from gpulab.kernels.common import ceil_div


def check_block_sum(kernel, sizes=(256, 1000), seed=0):
    """block_sum(out, x): out[b] = the sum of block b's BLOCK_SUM_THREADS elements of x."""
    require_own_kernel(kernel, "block_sum")
    rng = np.random.default_rng(seed)
    tpb = BLOCK_SUM_THREADS
    for n in sizes:
        x = rng.standard_normal(n).astype(np.float32)
        blocks = ceil_div(n, tpb)
        case = f"n={n}, {blocks} block(s) of {tpb} threads"
        out = GuardedOutput((blocks,), np.float32, np.nan)
        want = np.add.reduceat(x.astype(np.float64), np.arange(0, n, tpb))
        launch(kernel, "block_sum", blocks, tpb, out.view, cuda.to_device(x), case=case)
        got = out.result("block_sum", case)
        bad = bad_indices(got, want, rtol=1e-4, atol=1e-4)
        if bad.size == 0:
            continue
        b = int(bad[0, 0])
        first = x[b * tpb]
        if np.isnan(got[b]):
            hint = ("It was never written: after the tree, thread 0 of each block writes the "
                    "block's sum to out[cuda.blockIdx.x]. (out starts as NaN here, so adding "
                    "into it, atomically or not, leaves NaN: write, do not add.)")
        elif blocks > 1 and np.isclose(got[0], want.sum(), rtol=1e-4, atol=1e-4):
            hint = "out[0] holds the whole array's sum: write one sum per block instead."
        elif n % tpb and bad[:, 0].tolist() == [blocks - 1]:
            hint = ("Only the last, partial block is wrong: threads past the end of x must put "
                    "0.0 in shared memory (`x[i] if i < x.size else 0.0`) and still take part in "
                    "every cuda.syncthreads().")
        elif np.isclose(got[b], first, rtol=1e-6, atol=1e-6):
            hint = ("It equals the block's first element: thread 0 added nothing in. Either "
                    "the halving loop never ran (threads t < stride add cache[t + stride] into "
                    "cache[t], then stride //= 2, until stride is 0), or thread 0 read the "
                    "other cells before their threads wrote them: cuda.syncthreads() after "
                    "loading and after every step.")
        else:
            hint = ("Check the tree: stride starts at THREADS // 2 and halves each step; threads "
                    "t < stride add cache[t + stride] into cache[t]; cuda.syncthreads() after "
                    "loading and after every step, outside the `if`. A missing barrier can "
                    "give different answers from run to run.")
        raise AssertionError(
            f"block_sum ({case}): out[{b}] is {got[b]:.5f}, expected {want[b]:.5f} (the sum of "
            f"x[{b * tpb}:{min(n, (b + 1) * tpb)}]). {len(bad)} of {blocks} blocks are wrong. "
            f"{hint}")


def check_block_sum_races(kernel, n=2 * BLOCK_SUM_THREADS - 5, seed=0):
    """block_sum under the race detector: two blocks, the last one partial."""
    require_own_kernel(kernel, "block_sum")
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    blocks = ceil_div(n, BLOCK_SUM_THREADS)
    out = np.zeros(blocks, dtype=np.float32)
    check_races(kernel, "block_sum", blocks, BLOCK_SUM_THREADS, out, x, case=f"n={n}")




# ----------------------------------------------------------------------------- technique

GPU_SIZE, GPU_MIN_SPEEDUP = 1 << 22, 2.0  # against _serial_block_sum, where thread 0 adds all


@cuda.jit
def _serial_block_sum(out, x):
    """The technique's yardstick on a GPU: thread 0 of each block adds the block's elements."""
    if cuda.threadIdx.x == 0:
        start = cuda.blockIdx.x * cuda.blockDim.x
        total = 0.0
        for i in range(start, min(start + cuda.blockDim.x, x.size)):
            total += x[i]
        out[cuda.blockIdx.x] = total


def check_block_sum_technique(kernel, n=2 * BLOCK_SUM_THREADS, seed=0):
    """A shared-memory tree: on the simulator, no thread reads more than two elements per step
    of the log2(THREADS) steps (plus its own); on a GPU, at least GPU_MIN_SPEEDUP x as fast as
    a block sum in which thread 0 adds every element."""
    require_own_kernel(kernel, "block_sum")
    tpb = BLOCK_SUM_THREADS
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    blocks = ceil_div(n, tpb)
    if not gpulab.runner.simulator:
        return _check_speed(kernel)
    case = f"n={n}, {blocks} blocks of {tpb} threads"
    trace = trace_kernel(kernel, "block_sum", blocks, tpb, np.zeros(blocks, np.float32), x,
                         case=case)
    require_tree(trace, "block_sum", case, tpb, reads_per_step=2,
                 hint="Halve the active threads each step: threads t < stride add "
                      "cache[t + stride] into cache[t]")


def _check_speed(kernel) -> None:
    tpb = BLOCK_SUM_THREADS
    x = np.random.default_rng(0).standard_normal(GPU_SIZE).astype(np.float32)
    blocks = ceil_div(GPU_SIZE, tpb)

    def make_args():
        return cuda.device_array(blocks, np.float32), cuda.to_device(x)

    ratio = measured_speedup(kernel, _serial_block_sum, blocks, tpb, blocks, tpb, make_args)
    if ratio < GPU_MIN_SPEEDUP:
        raise AssertionError(
            f"Halve the active threads each step: at n={GPU_SIZE}, block_sum is {ratio:.2f}x as "
            f"fast as one in which thread 0 adds the whole block, and a tree is at least "
            f"{GPU_MIN_SPEEDUP}x. The values are right; this is the technique's part.")
