"""The kernel cost model (gpulab.sim.cost) at full size, against published GPU measurements,
and, with a GPU, against measured time.

    modeled naive / tiled matmul, naive / padded transpose, global / shared histogram, atomic /
    tree sum on the H100 SXM: the ratios Lesson 02 shows (target: the optimized kernel models
    faster, > 1x)
    published tables (published_tables.py): the CUDA Best Practices Guide's V100 matmuls and
    Boehm's RTX A6000 SGEMM worklog, traced, scaled and modeled: each step's modeled speedup
    beside the published one (goal: within x1.5), the rank order of each table, the fraction
    of steps within x1.5, and the known miss behind each step outside it
    modeled / measured per kernel (gpu runner only): the model's time over CUDA-event time on
    this GPU; the goal is within 2x (0.5x to 2x). The model has no L1 tier, so naive kernels
    whose warps re-read a block's data model slower than they run

The traces need Numba's simulator, so they are taken in a subprocess on the cpu runner, at small
sizes, and scaled to the full size (the access pattern repeats block after block).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import published_tables
from common import Row

BENCH = "cost_model"
MODEL_GPU = "H100 SXM"
# kernel -> (module, small size, full size); the work ratio scales the traced counters
CASES = {
    "matmul_kernel_v1": ("matmul", 32, 2048), "matmul_kernel_v2": ("matmul", 32, 2048),
    "transpose_kernel_v1": ("transpose", 64, 8192), "transpose_kernel_v2": ("transpose", 64, 8192),
    "transpose_kernel_v3": ("transpose", 64, 8192),
    "reduce_kernel_v1": ("reduce", 2048, 1 << 24), "reduce_kernel_v2": ("reduce", 2048, 1 << 24),
    "histogram_kernel_v1": ("histogram", 4096, 1 << 24),
    "histogram_kernel_v2": ("histogram", 4096, 1 << 24),
}
PAIRS = (("matmul_kernel_v1", "matmul_kernel_v2", "naive / tiled matmul"),
         ("transpose_kernel_v1", "transpose_kernel_v3", "naive / padded transpose"),
         ("transpose_kernel_v2", "transpose_kernel_v3", "unpadded / padded transpose"),
         ("histogram_kernel_v1", "histogram_kernel_v2", "global / shared histogram"),
         ("reduce_kernel_v1", "reduce_kernel_v2", "atomic / tree sum"))

TRACE = r'''
import dataclasses, json, sys
import gpulab
import numpy as np
from gpulab.kernels import histogram, matmul, reduce, transpose
from gpulab.sim import count, run_traced

rng = np.random.default_rng(0)
cases = json.loads(sys.argv[1])
found = {}
for name, (module, n, _) in cases.items():
    kernel = getattr({"matmul": matmul, "transpose": transpose, "reduce": reduce,
                      "histogram": histogram}[module], name)
    if module == "matmul":
        a = rng.standard_normal((n, n)).astype(np.float32)
        t = run_traced(kernel, matmul.matmul_blocks(n, n), (matmul.TILE, matmul.TILE),
                       np.zeros((n, n), np.float32), a, a)
    elif module == "transpose":
        a = rng.standard_normal((n, n)).astype(np.float32)
        t = run_traced(kernel, transpose.transpose_blocks(n, n),
                       (transpose.TILE, transpose.BLOCK_ROWS), np.zeros((n, n), np.float32), a)
    elif module == "reduce":
        x = rng.random(n).astype(np.float32)
        t = run_traced(kernel, -(-n // reduce.THREADS), reduce.THREADS, np.zeros(1, np.float32), x)
    else:
        x = rng.integers(0, 16, n).astype(np.int32)
        t = run_traced(kernel, -(-n // 128), 128, np.zeros(16, np.int32), x)
    found[name] = dataclasses.asdict(count(t))
print(json.dumps(found))
'''


def _traced(script: str = TRACE, cases: dict = CASES) -> dict:
    env = {**os.environ, "GPULAB_RUNNER": "cpu"}
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", script, json.dumps(cases), here], env=env,
                          capture_output=True, text=True, check=True, timeout=900)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _size(name: str) -> str:
    module, _, full = CASES[name]
    return {"matmul": f"{full}^3", "transpose": f"{full} x {full}"}.get(module, f"n={full:,}")


def _full_size(name: str, traced):
    """The traced counters at the full size: a matmul's grid grows with n^2 and each block's
    K loop with n; a transpose's grid with n^2; a sum's and a histogram's with n."""
    module, small, full = CASES[name]
    ratio = full / small
    if module == "matmul":
        return traced.scaled(grid=ratio ** 2, loop=ratio)
    return traced.scaled(grid=ratio ** 2 if module == "transpose" else ratio)


def run(quick: bool = False) -> list[Row]:
    import gpulab
    from gpulab.kernels.matmul import matmul_flops
    from gpulab.sim.cost import Counters, model_time

    counters = {name: _full_size(name, Counters(**c)) for name, c in _traced().items()}
    modeled = {}
    for name, c in counters.items():
        module, _, full = CASES[name]
        flops = matmul_flops(full, full, full) if module == "matmul" else 0.0
        modeled[name] = model_time(c, MODEL_GPU, flops=flops).time_s
    rows = [Row(BENCH, f"modeled {label} on {MODEL_GPU}", modeled[slow] / modeled[fast], "x",
                "> 1x", modeled[slow] > modeled[fast],
                f"{_size(slow)}; a model, not a measurement")
            for slow, fast, label in PAIRS]
    if quick:  # a smoke test: tests/test_sim_published.py checks the tables' traced counts
        rows.append(Row(BENCH, "published tables", float("nan"), "", note="not run with --quick"))
    else:
        rows += published_tables.rows(_traced(published_tables.TRACE, published_tables.to_trace()))
    if gpulab.runner.name == "gpu":
        rows += _measured_rows(counters)
    return rows


def _measured_rows(counters: dict) -> list[Row]:
    import numpy as np
    from numba import cuda

    from gpulab.hardware import this_machine
    from gpulab.kernels import histogram, matmul, reduce, transpose
    from gpulab.kernels.matmul import matmul_flops
    from gpulab.sim.cost import model_time
    from gpulab.timing import benchmark

    gpu = this_machine("cuda")
    if gpu is None:
        return [Row(BENCH, "modeled / measured", float("nan"), "x", note="this GPU is not in "
                    "gpulab's spec sheet: nothing to model it with")]
    rng = np.random.default_rng(0)
    rows = []
    for name, c in counters.items():
        module, _, n = CASES[name]
        kernel = getattr({"matmul": matmul, "transpose": transpose, "reduce": reduce,
                          "histogram": histogram}[module], name)
        if module == "matmul":
            a = cuda.to_device(rng.standard_normal((n, n)).astype(np.float32))
            args, grid, block = (cuda.device_array((n, n), np.float32), a, a), \
                matmul.matmul_blocks(n, n), (matmul.TILE, matmul.TILE)
        elif module == "transpose":
            a = cuda.to_device(rng.standard_normal((n, n)).astype(np.float32))
            args, grid, block = (cuda.device_array((n, n), np.float32), a), \
                transpose.transpose_blocks(n, n), (transpose.TILE, transpose.BLOCK_ROWS)
        elif module == "reduce":
            args = (cuda.to_device(np.zeros(1, np.float32)),
                    cuda.to_device(rng.random(n).astype(np.float32)))
            grid, block = -(-n // reduce.THREADS), reduce.THREADS
        else:
            args = (cuda.to_device(np.zeros(16, np.int32)),
                    cuda.to_device(rng.integers(0, 16, n).astype(np.int32)))
            grid, block = -(-n // 128), 128
        measured = benchmark(lambda k=kernel, g=grid, b=block, a=args: k[g, b](*a), warmup=3,
                             repeat=20, cuda=True).median_s
        flops = matmul_flops(n, n, n) if module == "matmul" else 0.0
        ratio = model_time(c, gpu, flops=flops).time_s / measured
        rows.append(Row(BENCH, f"modeled / measured, {name}", ratio, "x", "0.5x to 2x",
                        0.5 <= ratio <= 2.0, f"{gpu.name}, measured median "
                        f"{measured * 1e6:.1f} us"))
    return rows
