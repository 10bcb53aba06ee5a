"""Lab 1, Part 7: a 1-D convolution (stencil) with its halo staged in shared memory
(check_stencil, check_stencil_races, check_stencil_technique).

stencil(out, x, w): out[i] = sum over j of w[j] * x[i + j - RADIUS], x read as 0 outside
[0, n); one thread per output, blocks of STENCIL_THREADS. Each output needs 2 RADIUS + 1 inputs,
and neighbouring outputs share all but one of them: a block loads its STENCIL_THREADS inputs
plus a halo of RADIUS on each side into shared memory once, and every tap reads from there.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, check_races, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.harness.technique import Yardstick, judge_technique, trace_kernel
from gpulab.checks.lab1.config import RADIUS, STENCIL_THREADS
from gpulab.kernels.common import ceil_div

TAPS = 2 * RADIUS + 1
HINT = 'gpulab.hint("lab1", "stencil")'
HALO_SLACK = 1.25  # over the formula: a kernel may load a little more at the array's ends
SPEED_SIZE = 1 << 24  # the gpu runner's timing, printed and not graded


def stencil_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """out[i] = sum_j w[j] * x[i + j - RADIUS], zeros outside x, in float64."""
    padded = np.concatenate([np.zeros(RADIUS), x.astype(np.float64), np.zeros(RADIUS)])
    return sum(w[j] * padded[j:j + x.size] for j in range(TAPS))


def _inputs(n: int, rng):
    return (rng.standard_normal(n).astype(np.float32),
            rng.standard_normal(TAPS).astype(np.float32))


def check_stencil(kernel, sizes=(256, 1000), seed=0):
    """stencil(out, x, w) against stencil_reference, for sizes that are and are not multiples
    of STENCIL_THREADS (the last block's halo sticks out of x)."""
    require_own_kernel(kernel, "stencil")
    rng = np.random.default_rng(seed)
    tpb = STENCIL_THREADS
    for n in sizes:
        x, w = _inputs(n, rng)
        blocks = ceil_div(n, tpb)
        case = f"n={n}, {blocks} block(s) of {tpb} threads, RADIUS={RADIUS}"
        out = GuardedOutput((n,), np.float32, np.nan)
        want = stencil_reference(x, w)
        launch(kernel, "stencil", blocks, tpb, out.view, cuda.to_device(x), cuda.to_device(w),
               case=case)
        got = out.result("stencil", case)
        bad = bad_indices(got, want, rtol=1e-4, atol=1e-4)
        if bad.size == 0:
            continue
        i = int(bad[0, 0])
        edges = {b for b in bad[:, 0].tolist() if b % tpb < RADIUS or b % tpb >= tpb - RADIUS}
        if np.isnan(got[i]):
            hint = "It was never written: every thread with i < n writes out[i]."
        elif len(edges) == len(bad):
            hint = ("Only outputs within RADIUS of a block's edge are wrong: the halo, the "
                    f"{RADIUS} inputs past each end of the block's own, was not loaded, or not "
                    "where the taps read it (0.0 where it falls outside x).")
        else:
            hint = (f"Check the taps: out[i] weights x[i - RADIUS] by w[0], and so on up to "
                    f"x[i + RADIUS] by w[{TAPS - 1}], each read where the tile holds it, after a "
                    "cuda.syncthreads() that follows every load.")
        raise AssertionError(
            f"{hint} (stencil, {case}: out[{i}] is {got[i]:.5f}, expected {want[i]:.5f}; "
            f"{len(bad)} of {n} outputs are wrong. More: {HINT}.)")


def check_stencil_races(kernel, n=2 * STENCIL_THREADS - 5, seed=0):
    """stencil under the race detector: two blocks, the last one partial."""
    require_own_kernel(kernel, "stencil")
    x, w = _inputs(n, np.random.default_rng(seed))
    check_races(kernel, "stencil", ceil_div(n, STENCIL_THREADS), STENCIL_THREADS,
                np.zeros(n, np.float32), x, w, case=f"n={n}")


# ----------------------------------------------------------------------------- technique


def halo_read_bytes(n: int, threads: int = STENCIL_THREADS, itemsize: int = 4) -> int:
    """Global bytes of x a block-tiled stencil reads: each block its elements and the halo."""
    return (n + 2 * RADIUS * ceil_div(n, threads)) * itemsize


@cuda.jit
def _plain_stencil(out, x, w):
    """What the gpu runner times stencil against: every tap read from global memory."""
    i = cuda.grid(1)
    if i < out.size:
        total = 0.0
        for j in range(w.size):
            k = i + j - w.size // 2
            if 0 <= k < x.size:
                total += w[j] * x[k]
        out[i] = total


def check_stencil_technique(kernel, n=2 * STENCIL_THREADS, seed=0):
    """The halo is staged in shared memory, judged on the simulator's trace on both runners
    (technique_verdict); the gpu runner prints the measured speed beside it."""
    require_own_kernel(kernel, "stencil")
    judge_technique(technique_verdict, kernel, {"n": n, "seed": seed}, _yardstick)


def technique_verdict(kernel, n=2 * STENCIL_THREADS, seed=0):
    """Global bytes read of x within HALO_SLACK of halo_read_bytes."""
    tpb = STENCIL_THREADS
    x, w = _inputs(n, np.random.default_rng(seed))
    blocks = ceil_div(n, tpb)
    case = f"n={n}, {blocks} blocks of {tpb} threads, RADIUS={RADIUS}"
    trace = trace_kernel(kernel, "stencil", blocks, tpb, np.zeros(n, np.float32), x, w,
                         case=case)
    got, want = trace.bytes_read_by_array.get("x", 0), halo_read_bytes(n)
    if got > HALO_SLACK * want:
        raise AssertionError(
            f"Load each block's x, with a halo of RADIUS on each side, into shared memory once, "
            f"then read the taps from there: stencil ({case}) reads {got / want:.1f}x the global "
            f"bytes of x that a stencil with its halo in shared memory reads ({got} B against "
            f"{want} B), so every thread reads its {TAPS} taps from global memory. The values "
            f"are right; this is the technique's part. More: {HINT}.")


def _yardstick() -> Yardstick:
    x, w = _inputs(SPEED_SIZE, np.random.default_rng(0))
    return Yardstick(_plain_stencil, "one that reads every tap from global memory",
                     f"n={SPEED_SIZE}", ceil_div(SPEED_SIZE, STENCIL_THREADS), STENCIL_THREADS,
                     lambda: (cuda.device_array(SPEED_SIZE, np.float32), cuda.to_device(x),
                              cuda.to_device(w)))
