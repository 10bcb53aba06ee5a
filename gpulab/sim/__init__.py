"""Seeing and checking Numba CUDA kernels on the CPU: memory-access traces, race and barrier
checks, and pictures, built on Numba's CUDA simulator.

    from gpulab.sim import run_traced, find_races, check_no_races, RaceError
    trace = run_traced(kernel, blocks, threads_per_block, *args)   # like kernel[blocks, tpb]
    trace.global_bytes_read, trace.bytes_by_array, trace.accesses  # what it moved
    trace.races, trace.barrier_errors                              # what it got wrong
    check_no_races(kernel, blocks, threads_per_block, *args)       # raises RaceError
    model_time(count(trace).scaled(grid=g, loop=l), "H100 SXM", flops=...)  # modeled time
    performance_report({"saxpy": Run(trace, work, flops)}, "A100")  # a table of them

trace.py records, races.py judges, counters.py counts requests (loops.py lines up a warp's
loop turns), scaling.py takes counts to full size, cost.py models time, report.py tables
those, draw.py draws; scheduler.py runs the threads of a block one at a time so that every run
is the same; portable.py packs a kernel to trace it in another process.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from gpulab.sim.cost import Counters, ModeledTime, count, model_time
from gpulab.sim.draw import draw_access, draw_traffic, touch_grid, traffic_table
from gpulab.sim.races import explain
from gpulab.sim.records import (
    Access,
    DivergentBarrier,
    KernelTimeout,
    OutOfBoundsError,
    Race,
    RaceError,
)
from gpulab.sim.report import Run, performance_report
from gpulab.sim.trace import Trace, check_no_races, find_races, run_traced

__all__ = [
    "Access",
    "Counters",
    "ModeledTime",
    "DivergentBarrier",
    "KernelTimeout",
    "OutOfBoundsError",
    "Race",
    "RaceError",
    "Run",
    "Trace",
    "check_no_races",
    "count",
    "draw_access",
    "draw_traffic",
    "explain",
    "find_races",
    "model_time",
    "performance_report",
    "run_traced",
    "touch_grid",
    "traffic_table",
]
