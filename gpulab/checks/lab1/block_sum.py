"""Lab 1, Part 2: a coarsened block sum (check_block_sum, check_block_sum_races, and
check_block_sum_technique: coalesced loads, then a tree, not one thread adding the block).

block_sum(out, x): block b of THREADS threads sums the ITEMS_PER_THREAD x THREADS elements
x[b * CHUNK : (b + 1) * CHUNK] (CHUNK = ITEMS_PER_THREAD x THREADS) into out[b]. Each thread first
adds ITEMS_PER_THREAD elements on its own (thread coarsening: fewer blocks, fewer barriers per
element), and the block's threads then combine their partial sums as a tree in shared memory.
Lesson 02's reduce_kernel_v2 sums one element per thread: retyped, it sums the wrong elements.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.harness.technique import (
    Yardstick,
    judge_technique,
    require_tree,
    trace_kernel,
)
from gpulab.checks.lab1.config import BLOCK_SUM_THREADS, ITEMS_PER_THREAD
from gpulab.kernels.common import ceil_div

CHUNK = ITEMS_PER_THREAD * BLOCK_SUM_THREADS  # elements one block sums
HINT = 'gpulab.hint("lab1", "block_sum")'


def block_sum_reference(x: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """The sum of each `chunk` consecutive elements of x (the last chunk may be short), float64."""
    return np.add.reduceat(x.astype(np.float64), np.arange(0, x.size, chunk))


def block_sum_blocks(n: int) -> int:
    """The grid the checker launches: one block per CHUNK elements of x."""
    return ceil_div(n, CHUNK)


def check_block_sum(kernel, sizes=(256, 1000), seed=0):
    """block_sum(out, x): out[b] = the sum of block b's CHUNK elements of x; blocks of
    BLOCK_SUM_THREADS threads, as many as cover x."""
    require_own_kernel(kernel, "block_sum")
    rng = np.random.default_rng(seed)
    tpb = BLOCK_SUM_THREADS
    for n in sizes:
        x = rng.standard_normal(n).astype(np.float32)
        blocks = block_sum_blocks(n)
        case = f"n={n}, {blocks} block(s) of {tpb} threads, {CHUNK} elements per block"
        out = GuardedOutput((blocks,), np.float32, np.nan)
        want = block_sum_reference(x)
        launch(kernel, "block_sum", blocks, tpb, out.view, cuda.to_device(x), case=case)
        got = out.result("block_sum", case)
        bad = bad_indices(got, want, rtol=1e-4, atol=1e-4)
        if bad.size == 0:
            continue
        b = int(bad[0, 0])
        start = b * CHUNK
        # What two designs of one element per thread give: lesson 02's grid (block b sums
        # x[64 b : 64 (b + 1)]), and a block that reads only the first 64 of its 256.
        one_each = block_sum_reference(x, tpb)[:blocks]
        heads = block_sum_reference(x[np.arange(n) % CHUNK < tpb], tpb)
        if np.isnan(got[b]):
            hint = ("It was never written: one thread of each block writes the block's sum to "
                    "out[cuda.blockIdx.x]. (out starts as NaN here, so adding into it, "
                    "atomically or not, leaves NaN: write, do not add.)")
        elif blocks > 1 and np.isclose(got[0], want.sum(), rtol=1e-4, atol=1e-4):
            hint = "out[0] holds the whole array's sum: write one sum per block instead."
        elif np.allclose(got, heads, rtol=1e-4, atol=1e-4):
            hint = (f"That is the sum of the block's first {tpb} elements only: each thread adds "
                    f"{ITEMS_PER_THREAD} elements of the block's {CHUNK}, not one.")
        elif n > tpb and np.allclose(got, one_each, rtol=1e-4, atol=1e-4):
            hint = (f"That is the sum of x[{b * tpb}:{(b + 1) * tpb}], one element per thread: "
                    f"here a block covers {CHUNK} elements, so each of its {tpb} threads adds "
                    f"{ITEMS_PER_THREAD} of them before the block combines its threads' sums.")
        elif n % CHUNK and bad[:, 0].tolist() == [blocks - 1]:
            hint = ("Only the last, partial block is wrong: elements past the end of x count as "
                    "0.0, and every thread still takes part in every cuda.syncthreads().")
        else:
            hint = ("The threads' partial sums were combined wrongly: a missing "
                    "cuda.syncthreads() (after the loads and after every step, reached by every "
                    "thread) lets a thread read a cell before it is written, and can give "
                    "different answers from run to run.")
        raise AssertionError(
            f"{hint} (block_sum, {case}: out[{b}] is {got[b]:.5f}, expected {want[b]:.5f}, the "
            f"sum of x[{start}:{min(n, start + CHUNK)}]; {len(bad)} of {blocks} blocks are "
            f"wrong. More: {HINT}.)")


def check_block_sum_races(kernel, n=CHUNK + BLOCK_SUM_THREADS + 3, seed=0):
    """block_sum under the race detector: two blocks, the last one partial."""
    require_own_kernel(kernel, "block_sum")
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    blocks = block_sum_blocks(n)
    out = np.zeros(blocks, dtype=np.float32)
    check_races(kernel, "block_sum", blocks, BLOCK_SUM_THREADS, out, x, case=f"n={n}")


# ----------------------------------------------------------------------------- technique

COALESCED = 4  # sectors of 32 B a warp's 32 neighbouring float32 loads take
SPEED_SIZE = 1 << 22  # the gpu runner's timing, printed and not graded


@cuda.jit
def _serial_block_sum(out, x):
    """What the gpu runner times block_sum against: thread 0 of each block adds the block."""
    if cuda.threadIdx.x == 0:
        start = cuda.blockIdx.x * CHUNK
        total = 0.0
        for i in range(start, min(start + CHUNK, x.size)):
            total += x[i]
        out[cuda.blockIdx.x] = total


def check_block_sum_technique(kernel, n=2 * CHUNK, seed=0):
    """Coalesced loads, then a shared-memory tree, judged on the simulator's trace on both
    runners (technique_verdict); the gpu runner prints the measured speed beside it."""
    require_own_kernel(kernel, "block_sum")
    judge_technique(technique_verdict, kernel, {"n": n, "seed": seed}, _yardstick)


def technique_verdict(kernel, n=2 * CHUNK, seed=0):
    """Loads of x take at most COALESCED sectors per warp request, and no thread reads more
    than its ITEMS_PER_THREAD elements, two per step of the log2(THREADS) steps, and one more."""
    from gpulab.sim.cost import count

    tpb = BLOCK_SUM_THREADS
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    blocks = block_sum_blocks(n)
    case = f"n={n}, {blocks} blocks of {tpb} threads"
    trace = trace_kernel(kernel, "block_sum", blocks, tpb, np.zeros(blocks, np.float32), x,
                         case=case)
    counters = count(trace)  # x is the only array block_sum loads from global memory
    per_request = counters.global_load_sectors / max(counters.global_load_requests, 1)
    if per_request > COALESCED + 0.5:
        raise AssertionError(
            f"Let neighbouring threads load neighbouring elements: block_sum ({case}) loads x "
            f"with {per_request:.1f} sectors of 32 B per warp request, where coalesced loads "
            f"take {COALESCED}. A warp's 32 threads each read their own run of "
            f"{ITEMS_PER_THREAD} elements, so their addresses lie {ITEMS_PER_THREAD} elements "
            f"apart. The values are right; this is the technique's part. More: {HINT}.")
    require_tree(trace, "block_sum", case, tpb, reads_per_step=2, own_reads=ITEMS_PER_THREAD,
                 hint="Combine the threads' sums as a tree: halve the active threads each step")


def _yardstick() -> Yardstick:
    x = np.random.default_rng(0).standard_normal(SPEED_SIZE).astype(np.float32)
    blocks = block_sum_blocks(SPEED_SIZE)
    return Yardstick(_serial_block_sum, "thread 0 adding each block", f"n={SPEED_SIZE}",
                     blocks, BLOCK_SUM_THREADS,
                     lambda: (cuda.device_array(blocks, np.float32), cuda.to_device(x)))
