"""The cost model against two published tables of real-GPU measurements (bench_cost_model).

Each kernel of published_kernels.py is traced small on the simulator (in a subprocess, see
bench_cost_model), taken to the published size by gpulab.sim.scaling (the grid, and the K loop
through two traced lengths), and modeled on the published GPU. Compared within one table only:

    the rank order of the kernels       modeled times against published speeds
    each step's speedup                 modeled time before over after, against the published
                                        ratio; the goal is within x1.5 (STEP_TOLERANCE)

A step the model misses is reported with the terms that bound its two kernels and the known
miss (gpulab.sim.cost's docstring) that those terms point to. No constant of the model is set
from these tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import Row

BENCH = "cost_model"
STEP_TOLERANCE = 1.5
GUIDE_N = 8192  # the guide gives no M, N; at this size launch overhead is under 1%
BOEHM_N = 4096  # Boehm's 4092, rounded up to whole blocks (the same 128 x 128 grid)


@dataclass(frozen=True)
class Kernel:
    name: str  # in published_kernels.py
    label: str  # as the publication names it
    published: float  # GB/s or GFLOP/s: higher is faster
    turns: tuple[int, int] | None  # K traced at two lengths, or None: the loop does not grow


@dataclass(frozen=True)
class Table:
    title: str
    gpu: str
    unit: str
    kernels: tuple[Kernel, ...]


TABLES = (
    Table("V100 C=AB (Best Practices Guide)", "V100", "GB/s", (
        Kernel("ab_simple", "no optimization", 119.9, None),
        Kernel("ab_tile_of_a", "tile of A in shared memory", 144.4, None),
        Kernel("ab_tiles_of_a_and_b", "tiles of A and B", 195.5, None))),
    Table("V100 C=AA^T (Best Practices Guide)", "V100", "GB/s", (
        Kernel("aat_simple", "no optimization", 12.8, None),
        Kernel("aat_tile", "shared memory, [32][32]", 140.2, None),
        Kernel("aat_padded_tile", "[32][33], no bank conflicts", 199.4, None))),
    Table("RTX A6000 SGEMM (Boehm's worklog)", "RTX A6000", "GFLOP/s", (
        Kernel("sgemm_naive", "1 naive", 309.0, (32, 64)),
        Kernel("sgemm_coalesced", "2 coalescing", 1986.5, (32, 64)),
        Kernel("sgemm_shared", "3 shared-memory blocking", 2980.3, (32, 64)),
        Kernel("sgemm_1d_tiles", "4 1D block tiling", 8474.7, (16, 32)),
        Kernel("sgemm_2d_tiles", "5 2D block tiling", 15971.7, (16, 32)))),
)

KNOWN_MISSES = {
    "L2 cache": "no L1 tier: a block's re-reads hit L1 on a GPU, here they go through L2",
    "shared memory": "one pass per clock: latency and instruction issue are not in the trace",
    "memory": "no reuse across blocks: neighbouring blocks' shared tiles come from DRAM",
    "compute": "fp32 peak: the instructions beside the FMAs are not in the trace",
}

TAIL = "blocks per SM from threads and shared memory; registers, which set it on a GPU, unseen"

# The subprocess that traces: prints {kernel: [counters as a dict, ...]} as JSON, one set of
# counters per traced K (one when the loop does not grow).
TRACE = r'''
import dataclasses, json, sys
sys.path.insert(0, sys.argv[2])
import gpulab
import numpy as np
import published_kernels as pk
from gpulab.sim import count, run_traced

def zeros(n):
    return np.zeros(n, np.float32)

def trace(name, k):
    kernel = getattr(pk, name)
    if name.startswith("ab_"):  # one block: A is 32 x w, B is w x 32
        return run_traced(kernel, (1, 1), (32, 32), zeros(32 * pk.W), zeros(pk.W * 32),
                          zeros(32 * 32), 32)
    if name.startswith("aat_"):  # a diagonal and an off-diagonal block of C = A A^T
        return run_traced(kernel, (2, 1), (32, 32), zeros(64 * pk.W), zeros(64 * 64), 64)
    n, threads = {"sgemm_naive": (32, (32, 32)), "sgemm_coalesced": (32, 1024),
                  "sgemm_shared": (32, 1024), "sgemm_1d_tiles": (64, 512),
                  "sgemm_2d_tiles": (128, 256)}[name]
    args = (n, n, k, np.float32(1.0), zeros(n * k), zeros(k * n), np.float32(0.0), zeros(n * n))
    return run_traced(kernel, (1, 1), threads, *args)

found = {}
for name, turns in json.loads(sys.argv[1]).items():
    found[name] = [dataclasses.asdict(count(trace(name, k))) for k in (turns or [0])]
print(json.dumps(found))
'''


def to_trace() -> dict:
    return {k.name: k.turns for table in TABLES for k in table.kernels}


def full_size(kernel: Kernel, counters: list):
    """The traced counters at the published size (gpulab.sim.scaling)."""
    from gpulab.sim.scaling import extrapolated

    if kernel.turns is None:  # w = 32 whatever the size: only the grid grows
        return counters[0].scaled(grid=(GUIDE_N // 32) ** 2 / counters[0].blocks)
    tile = {"sgemm_1d_tiles": 64, "sgemm_2d_tiles": 128}.get(kernel.name, 32)
    return extrapolated(counters[0], counters[1], turns=kernel.turns, to_turns=BOEHM_N,
                        grid=(BOEHM_N // tile) ** 2 / counters[0].blocks)


def flops(table: Table) -> float:
    n = BOEHM_N if table.unit == "GFLOP/s" else GUIDE_N
    return 2.0 * n ** 3 if table.unit == "GFLOP/s" else 2.0 * n * n * 32


def rows(traced: dict) -> list[Row]:
    """Per table: each kernel's modeled time, each step against the published one, the rank
    order; then the fraction of all steps within STEP_TOLERANCE."""
    from gpulab.sim.cost import Counters, model_time

    out, steps_ok, steps = [], 0, 0
    for table in TABLES:
        modeled = {}
        for k in table.kernels:
            c = full_size(k, [Counters(**d) for d in traced[k.name]])
            modeled[k.name] = model_time(c, table.gpu, flops=flops(table))
            out.append(Row(BENCH, f"{table.title}: {k.label}", modeled[k.name].time_s * 1e3,
                           "ms modeled", note=f"published {k.published:g} {table.unit}; "
                           f"{modeled[k.name].bound}-bound"))
        for slow, fast in zip(table.kernels, table.kernels[1:], strict=False):
            t_slow, t_fast = modeled[slow.name], modeled[fast.name]
            model_step = t_slow.time_s / t_fast.time_s
            published_step = fast.published / slow.published
            off = max(model_step / published_step, published_step / model_step)
            ok = off <= STEP_TOLERANCE
            steps, steps_ok = steps + 1, steps_ok + ok
            note = f"published {published_step:.2f}x"
            if not ok:
                misses = [KNOWN_MISSES.get(b, b) for b in dict.fromkeys((t_slow.bound,
                                                                          t_fast.bound))]
                misses += [f"{k.label} fills {t.utilization:.0%} of its waves' slots ({TAIL})"
                           for k, t in ((slow, t_slow), (fast, t_fast)) if t.utilization < 0.9]
                note += "; known miss: " + "; ".join(misses)
            out.append(Row(BENCH, f"{table.title}: {slow.label} -> {fast.label}", model_step,
                           "x", f"within x{STEP_TOLERANCE:g} of published", ok, note))
        by_model = sorted(table.kernels, key=lambda k: -modeled[k.name].time_s)
        by_published = sorted(table.kernels, key=lambda k: k.published)
        same = by_model == by_published
        out.append(Row(BENCH, f"{table.title}: rank order", float(same), "", "as published",
                       same, "slowest to fastest: " + ", ".join(k.label for k in by_model)))
    out.append(Row(BENCH, f"published steps within x{STEP_TOLERANCE:g}", steps_ok / steps, "",
                   "1 (every step)", steps_ok == steps, f"{steps_ok} of {steps}"))
    return out
