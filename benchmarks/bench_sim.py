"""What tracing costs and what it shows, on the lesson's naive and tiled matmuls.

    traced / plain simulator time   recording every access and keeping barrier books should
                                    cost no more than a small factor over the simulator itself
    race check / trace time         finding races after a trace is cheap next to the run
    tiled / naive global bytes      the figure lesson 02 draws: tiling divides traffic by TILE

On the gpu runner a plain launch runs on the GPU, so the first ratio has no meaning there and
only the traced time is reported.
"""

from __future__ import annotations

import time

import numpy as np
from common import Row


def _seconds(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def run(quick: bool) -> list[Row]:
    import gpulab
    from gpulab.kernels.matmul import TILE, matmul_kernel_v1, matmul_kernel_v2
    from gpulab.sim import run_traced
    from gpulab.sim.races import races_in

    n = TILE if quick else 2 * TILE
    repeat = 3
    blocks = (n // TILE, n // TILE)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    c = np.zeros((n, n), np.float32)
    note = f"{n}x{n} float32, TILE={TILE}, {gpulab.runner.name} runner"
    rows = []

    traces = {}
    for name, kernel in (("naive", matmul_kernel_v1), ("tiled", matmul_kernel_v2)):
        traced = _seconds(lambda k=kernel, nm=name: traces.__setitem__(
            nm, run_traced(k, blocks, (TILE, TILE), c, a, b)), repeat)
        rows.append(Row("sim", f"traced {name} matmul time", traced, "s", note=note))
        if gpulab.runner.simulator:
            plain = _seconds(lambda k=kernel: k[blocks, (TILE, TILE)](c, a, b), repeat)
            ratio = traced / plain
            rows.append(Row("sim", f"traced / plain simulator time, {name} matmul", ratio, "x",
                            target="<= 3x", ok=ratio <= 3, note=note))
        analysis = _seconds(lambda nm=name: races_in(traces[nm]), repeat)
        rows.append(Row("sim", f"race check / trace time, {name} matmul", analysis / traced,
                        "x", target="<= 0.5x", ok=analysis / traced <= 0.5, note=note))

    ratio = traces["tiled"].global_bytes_read / traces["naive"].global_bytes_read
    rows.append(Row("sim", "tiled / naive global bytes read", ratio, "x",
                    target=f"= 1/{TILE}", ok=bool(np.isclose(ratio, 1 / TILE)), note=note))
    return rows
