"""gpulab/kernels/ measured: each optimized kernel against its naive version and against the
library call people would otherwise use (torch.matmul is cuBLAS, torch.sum, a torch copy).

gpu runner: matmul TFLOP/s (naive, tiled, cuBLAS), transpose GB/s (naive, tile, padded tile,
torch's transpose copy), reduction GB/s (atomics, shared tree, warp shuffles, torch.sum), and the
ratios the lesson claims (tiled beats naive, padding beats bank conflicts, one atomic per block
beats one per element). Kernels run on device arrays, so the times exclude host copies.

cpu runner: the comparison needs a GPU, so it reports that, and the simulator's wall time for a
tiny naive and tiled matmul, which only shows what a simulated barrier costs.
"""

from __future__ import annotations

import numpy as np
from common import Row

BENCH = "kernels"


def _row(metric, value, unit, target="", ok=None, note=""):
    return Row(BENCH, metric, float(value), unit, target, ok, note)


def _speedup_row(metric, slow_s, fast_s, note):
    """fast's speedup over slow; the target is the lesson's claim that fast is faster."""
    ratio = slow_s / fast_s
    return _row(metric, ratio, "x", "> 1x", ratio > 1.0, note)


def run(quick: bool) -> list[Row]:
    import gpulab  # decides the runner before numba.cuda is imported

    if gpulab.runner.name != "gpu":
        return _cpu_rows(quick)
    return _matmul_rows(quick) + _transpose_rows(quick) + _reduce_rows(quick)


# ----------------------------------------------------------------------------- cpu runner


def _cpu_rows(quick: bool) -> list[Row]:
    from gpulab.kernels import matmul as mm
    from gpulab.timing import benchmark

    rows = [_row("kernel speed comparison", float("nan"), "", note=(
        "needs a GPU: on the cpu runner kernels run on Numba's CUDA simulator, one Python "
        "thread per CUDA thread, so their times say nothing about a GPU"))]
    n = 16 if quick else 32
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    note = f"{n}x{n} on the simulator, information only"
    times = {}
    for name, kernel in (("naive", mm.matmul_kernel_v1), ("tiled", mm.matmul_kernel_v2)):
        t = benchmark(mm.launch_matmul, kernel, a, a, warmup=0 if quick else 1,
                      repeat=1 if quick else 3)
        times[name] = t.median_s
        rows.append(_row(f"simulator wall time, {name} matmul", t.median_s, "s", note=note))
    rows.append(_row("simulator wall time, tiled / naive matmul", times["tiled"] / times["naive"],
                     "x", note=f"{note}: each simulated barrier costs Python thread switches"))
    return rows


# ----------------------------------------------------------------------------- gpu runner


def _device_arrays(*tensors):
    """Numba views of torch CUDA tensors: no copy, the kernels write into torch's memory."""
    from numba import cuda

    return [cuda.as_cuda_array(t) for t in tensors]


def _time(fn):
    from gpulab.timing import benchmark

    return benchmark(fn, warmup=3, repeat=10, cuda=True)


def _matmul_rows(quick: bool) -> list[Row]:
    import torch

    from gpulab.kernels import matmul as mm

    n = 1024 if quick else 4096
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    d_c, d_a, d_b = _device_arrays(c, a, b)
    tpb = (mm.TILE, mm.TILE)
    blocks = mm.matmul_blocks(n, n, tpb)
    flops = mm.matmul_flops(n, n, n)
    note = f"{n}x{n} float32; cuBLAS without TF32"

    def naive():
        mm.matmul_kernel_v1[blocks, tpb](d_c, d_a, d_b)

    def tiled():
        mm.matmul_kernel_v2[blocks, tpb](d_c, d_a, d_b)

    def cublas():
        torch.matmul(a, b, out=c)

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 against fp32, not against tensor cores
    try:
        times = {name: _time(fn) for name, fn in
                 (("naive", naive), ("tiled", tiled), ("cuBLAS", cublas))}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    rows = [_row(f"matmul {name}", t.tflops(flops), "TFLOP/s", note=note)
            for name, t in times.items()]
    rows.append(_speedup_row("matmul tiled speedup over naive", times["naive"].median_s,
                             times["tiled"].median_s, note))
    rows.append(_row("matmul tiled / cuBLAS speed", times["cuBLAS"].median_s
                     / times["tiled"].median_s, "x", note=note))
    return rows


def _transpose_rows(quick: bool) -> list[Row]:
    import torch

    from gpulab.kernels import transpose as tp

    r, c = (2048, 2048) if quick else (8192, 8192)
    a = torch.randn(r, c, device="cuda")
    out = torch.empty(c, r, device="cuda")
    d_out, d_a = _device_arrays(out, a)
    blocks, tpb = tp.transpose_blocks(r, c), (tp.TILE, tp.BLOCK_ROWS)
    n_bytes = tp.transpose_bytes(r, c)
    note = f"{r}x{c} float32"

    def launcher(kernel):
        return lambda: kernel[blocks, tpb](d_out, d_a)

    times = {"naive": _time(launcher(tp.transpose_kernel_v1)),
             "tile": _time(launcher(tp.transpose_kernel_v2)),
             "padded tile": _time(launcher(tp.transpose_kernel_v3)),
             "torch": _time(lambda: out.copy_(a.t()))}
    rows = [_row(f"transpose {name}", t.gbps(n_bytes), "GB/s", note=note)
            for name, t in times.items()]
    rows.append(_speedup_row("transpose tile speedup over naive", times["naive"].median_s,
                             times["tile"].median_s, note + ": coalesced writes"))
    rows.append(_speedup_row("transpose padded speedup over tile", times["tile"].median_s,
                             times["padded tile"].median_s, note + ": no bank conflicts"))
    return rows


def _reduce_rows(quick: bool) -> list[Row]:
    import torch

    from gpulab.kernels import reduce as rd
    from gpulab.kernels.common import blocks_for

    n = 1 << 22 if quick else 1 << 26
    x = torch.randn(n, device="cuda")
    out = torch.zeros(1, device="cuda")
    d_out, d_x = _device_arrays(out, x)
    blocks = blocks_for(n, rd.THREADS)
    n_bytes = rd.reduce_bytes(n)
    note = f"n = 2**{n.bit_length() - 1} float32; the kernels' times include zeroing out"

    def launcher(kernel):
        def fn():
            out.zero_()  # the kernels add into out: start each run from zero
            kernel[blocks, rd.THREADS](d_out, d_x)
        return fn

    times = {"atomics": _time(launcher(rd.reduce_kernel_v1)),
             "shared tree": _time(launcher(rd.reduce_kernel_v2)),
             "warp shuffle": _time(launcher(rd.reduce_kernel_v3)),
             "torch.sum": _time(lambda: torch.sum(x))}
    rows = [_row(f"reduce {name}", t.gbps(n_bytes), "GB/s", note=note)
            for name, t in times.items()]
    rows.append(_speedup_row("reduce shared tree speedup over atomics",
                             times["atomics"].median_s, times["shared tree"].median_s, note))
    rows.append(_row("reduce warp shuffle / torch.sum speed", times["torch.sum"].median_s
                     / times["warp shuffle"].median_s, "x", note=note))
    return rows
