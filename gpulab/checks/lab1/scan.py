"""Lab 1, Part 8: a block prefix sum (scan) in shared memory (check_block_scan,
check_block_scan_races, check_block_scan_technique).

block_scan(out, x): out[i] = x[b*T] + ... + x[i], the inclusive prefix sum of x within its block
b of T = SCAN_THREADS elements (a scan of the whole array adds each block's total to the next
blocks: a second kernel, not asked here). A parallel scan takes log2(T) steps in shared memory
(Hillis-Steele: at step d, element t adds element t - 2**d; or Blelloch's up- and down-sweep),
and no thread walks the block alone.
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
from gpulab.checks.lab1.config import SCAN_THREADS
from gpulab.kernels.common import ceil_div

SPEED_SIZE = 1 << 22  # the gpu runner's timing, printed and not graded
HINT = 'gpulab.hint("lab1", "block_scan")'


def block_scan_reference(x: np.ndarray, threads: int = SCAN_THREADS) -> np.ndarray:
    """Each block's inclusive prefix sums, in float64."""
    out = np.empty(x.size, np.float64)
    for start in range(0, x.size, threads):
        out[start:start + threads] = np.cumsum(x[start:start + threads], dtype=np.float64)
    return out


def check_block_scan(kernel, sizes=(256, 1000), seed=0):
    """block_scan(out, x) against block_scan_reference, including a partial last block."""
    require_own_kernel(kernel, "block_scan")
    rng = np.random.default_rng(seed)
    tpb = SCAN_THREADS
    for n in sizes:
        x = rng.standard_normal(n).astype(np.float32)
        blocks = ceil_div(n, tpb)
        case = f"n={n}, {blocks} block(s) of {tpb} threads"
        out = GuardedOutput((n,), np.float32, np.nan)
        want = block_scan_reference(x)
        launch(kernel, "block_scan", blocks, tpb, out.view, cuda.to_device(x), case=case)
        got = out.result("block_scan", case)
        bad = bad_indices(got, want, rtol=1e-3, atol=1e-3)
        if bad.size == 0:
            continue
        i = int(bad[0, 0])
        start = i // tpb * tpb
        exclusive = want[i] - x[i]
        if np.isnan(got[i]):
            hint = "It was never written: every thread with i < n writes out[i]."
        elif np.isclose(got[i], exclusive, rtol=1e-3, atol=1e-3):
            hint = ("That is the exclusive scan (the sum before x[i]); this one includes x[i] "
                    "itself.")
        elif np.isclose(got[i], np.cumsum(x[:i + 1], dtype=np.float64)[-1], rtol=1e-3,
                        atol=1e-3):
            hint = "That is a scan of the whole array: each block starts again at its own start."
        else:
            hint = ("A step's reads and writes got mixed: every thread reads the partial sum it "
                    "adds before any thread of the block overwrites it (a barrier between the "
                    "reads and the writes, and another before the next step), and the distance "
                    "doubles each step, from 1 to THREADS / 2.")
        raise AssertionError(
            f"{hint} (block_scan, {case}: out[{i}] is {got[i]:.4f}, expected {want[i]:.4f}, the "
            f"sum of x[{start}:{i + 1}]; {len(bad)} of {n} outputs are wrong. More: {HINT}.)")


def check_block_scan_races(kernel, n=2 * SCAN_THREADS - 5, seed=0):
    """block_scan under the race detector: two blocks, the last one partial."""
    require_own_kernel(kernel, "block_scan")
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    check_races(kernel, "block_scan", ceil_div(n, SCAN_THREADS), SCAN_THREADS,
                np.zeros(n, np.float32), x, case=f"n={n}")


# ----------------------------------------------------------------------------- technique


@cuda.jit
def _serial_block_scan(out, x):
    """What the gpu runner times block_scan against: thread 0 of each block walks the block."""
    if cuda.threadIdx.x == 0:
        start = cuda.blockIdx.x * cuda.blockDim.x
        total = 0.0
        for i in range(start, min(start + cuda.blockDim.x, x.size)):
            total += x[i]
            out[i] = total


def check_block_scan_technique(kernel, n=2 * SCAN_THREADS, seed=0):
    """A parallel scan, judged on the simulator's trace on both runners (technique_verdict);
    the gpu runner prints the measured speed beside it."""
    require_own_kernel(kernel, "block_scan")
    judge_technique(technique_verdict, kernel, {"n": n, "seed": seed}, _yardstick)


def technique_verdict(kernel, n=2 * SCAN_THREADS, seed=0):
    """No thread reads more than four elements per step of the log2(THREADS) steps (a Blelloch
    sweep reads two on the way up and two on the way down)."""
    tpb = SCAN_THREADS
    blocks = ceil_div(n, tpb)
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    case = f"n={n}, {blocks} blocks of {tpb} threads"
    trace = trace_kernel(kernel, "block_scan", blocks, tpb, np.zeros(n, np.float32), x,
                         case=case)
    require_tree(trace, "block_scan", case, tpb, reads_per_step=4,
                 hint="Scan in log2(THREADS) steps across the block's threads, the distance "
                      "doubling each step")


def _yardstick() -> Yardstick:
    x = np.random.default_rng(0).standard_normal(SPEED_SIZE).astype(np.float32)
    return Yardstick(_serial_block_scan, "thread 0 walking each block", f"n={SPEED_SIZE}",
                     ceil_div(SPEED_SIZE, SCAN_THREADS), SCAN_THREADS,
                     lambda: (cuda.device_array(SPEED_SIZE, np.float32), cuda.to_device(x)))
