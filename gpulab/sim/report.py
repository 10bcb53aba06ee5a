"""A performance report of traced kernels: what each asks of memory, and its modeled time on a
GPU at full size, with where it sits under that GPU's roofline.

    runs = {"matmul_tiled": Run(trace, work=4096, flops=2 * m * n * k)}
    print(performance_report(runs, "A100"))

`work` scales a small traced launch to the full-size one by repeating its blocks (a grid of
tiles repeats its pattern). A kernel whose blocks also loop longer at full size says so
apart (scaling.py): `grid` (blocks) and `loop` (turns per block), and, for an exact line
through a block's fixed and per-turn work, a `longer` trace of the same grid at `longer_loop`
times the turns:

    Run(trace, grid=(4096 / 32) ** 2, loop=4096 / 32, flops=...)             # a shape
    Run(trace, grid=(4096 / 32) ** 2, loop=4096 / 32, longer=trace_k64, longer_loop=2.0)

`flops` is the full-size launch's fp32 math, which the trace cannot see. Every time here is
MODELED (gpulab.sim.cost), never measured.
Taught in: solutions/lab1_cuda_kernels (the performance report), lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab.sim.cost import count, model_time
from gpulab.sim.scaling import extrapolated


@dataclass(frozen=True)
class Run:
    """One traced launch, and how it scales to the launch the report is about."""

    trace: object  # a gpulab.sim.Trace
    work: float = 1.0  # full-size launch over the traced one, in blocks (when grid is None)
    flops: float = 0.0  # fp32 FLOPs of the full-size launch
    grid: float | None = None  # full-size blocks over traced blocks
    loop: float = 1.0  # full-size turns of each block's loop over the traced turns
    longer: object = None  # a Trace of the same grid with longer_loop times the turns
    longer_loop: float = 2.0

    def counters(self):
        """The traced launch's counters, scaled to the full-size launch."""
        traced = count(self.trace)
        if self.grid is None:
            return traced.scaled(self.work)
        if self.longer is None:
            return traced.scaled(grid=self.grid, loop=self.loop)
        return extrapolated(traced, count(self.longer), turns=(1.0, self.longer_loop),
                            to_turns=self.loop, grid=self.grid)

    def modeled(self, gpu):
        """The full-size launch's modeled time on `gpu` (a cost.ModeledTime)."""
        return model_time(self.counters(), gpu, flops=self.flops)


def performance_report(runs: dict[str, Run], gpu) -> str:
    """A table, a line per kernel: sectors per warp request and coalescing (bytes used over
    bytes moved), the worst bank conflict, global atomics, barriers per block, the modeled time
    on `gpu` and its largest term, and the arithmetic intensity against the GPU's fp32 ridge."""
    from gpulab.hardware import get_gpu, ops_per_byte

    spec = get_gpu(gpu)
    ridge = ops_per_byte(spec, "fp32")
    head = (f"{'kernel':<14}{'sectors/req':>12}{'coalesced':>10}{'bank ways':>10}"
            f"{'atomics':>12}{'barriers':>9}{'modeled':>11}  {'bound by':<16}{'FLOP/B':>7}"
            "  roofline")
    lines = [f"MODELED on {spec.name} (gpulab.sim.cost; fp32 ridge {ridge:.0f} FLOP/B)", head]
    for name, run in runs.items():
        c, t = run.counters(), run.modeled(spec)
        intensity = run.flops / c.global_bytes if c.global_bytes else 0.0
        side = "compute side" if intensity >= ridge else "memory side"
        lines.append(
            f"{name:<14}{c.sectors_per_request:>12.1f}{c.coalescing:>10.0%}"
            f"{c.worst_bank_conflict:>10}{c.global_atomics:>12,}{c.barriers_per_block:>9}"
            f"{_us(t.time_s):>11}  {t.bound:<16}{intensity:>7.2f}  {side}")
    return "\n".join(lines)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us" if seconds >= 1e-5 else f"{seconds * 1e6:.1f} us"
