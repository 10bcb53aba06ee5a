"""From the small launch the simulator can trace to the full-size launch a lesson is about.

A kernel grows two ways, and they scale different counters:

    grid   more blocks, each doing what a traced block did: totals grow, per-block figures
           (threads, shared memory, barriers per block, the worst bank conflict) stay
    loop   each block makes more turns of its main loop (the K loop of a matmul): its totals
           and its barriers grow, the number of blocks stays

    scaled(c, grid=g, loop=l)        a shape: every per-block figure in proportion to the turns
    extrapolated(short, long, ...)   two traces at two loop lengths, a straight line through
                                     each per-block figure: exact for a block that does a fixed
                                     amount (the stores of C, a first barrier) plus the same
                                     amount per turn, where `scaled` counts the fixed part once
                                     per turn as well

    c = count(run_traced(matmul, (2, 2), (16, 16), c32, a32, b32))        # n = K = 32
    scaled(c, grid=(4096 / 32) ** 2, loop=4096 / 32)                       # 4096^3, a shape
    extrapolated(c, count(trace_at_k64), turns=(32, 64), to_turns=4096, grid=(4096 / 32) ** 2)

Counters.scaled(work) keeps its one-factor meaning: `work` times the blocks.
Taught in: lessons/02_cuda_with_numba.ipynb, solutions/lab1_cuda_kernels (the performance report)
"""

from __future__ import annotations

import dataclasses

# Figures of one block that a bigger grid does not change.
PER_BLOCK = {"threads_per_block", "shared_bytes_per_block", "worst_bank_conflict",
             "barriers_per_block"}


def scaled(counters, grid: float = 1.0, loop: float = 1.0):
    """`grid` times the blocks, each making `loop` times the turns: totals grow by grid x loop,
    barriers per block by loop, the rest of a block's figures stay."""
    if grid <= 0 or loop <= 0:
        raise ValueError(f"grid and loop scale a launch up or down; got {grid}, {loop}")
    grow = {f.name: round(getattr(counters, f.name) * grid * loop)
            for f in dataclasses.fields(counters)
            if f.name not in PER_BLOCK and getattr(counters, f.name) is not None}
    grow["blocks"] = round(counters.blocks * grid)
    grow["barriers_per_block"] = round(counters.barriers_per_block * loop)
    return dataclasses.replace(counters, **grow)


def extrapolated(short, long, turns: tuple[float, float], to_turns: float, grid: float = 1.0):
    """Counters at `to_turns` loop turns per block and `grid` times the blocks, from two traces
    of the same grid at turns[0] and turns[1] turns: each per-block figure on a straight line."""
    (t0, t1), (c0, c1) = turns, (short, long)
    if c0.blocks != c1.blocks or t0 == t1:
        raise ValueError("extrapolate from two traces of the same grid at two loop lengths; "
                         f"got {c0.blocks} and {c1.blocks} blocks at {t0} and {t1} turns")

    def at(name: str, per_block: bool) -> float:
        a, b = getattr(c0, name), getattr(c1, name)
        if not per_block:  # a total: on the line per block, then times the blocks
            a, b = a / c0.blocks, b / c1.blocks
        value = max(0.0, a + (b - a) * (to_turns - t0) / (t1 - t0))
        return value if per_block else value * c0.blocks * grid

    fields = {f.name for f in dataclasses.fields(c0)} - PER_BLOCK - {"blocks"}
    grow = {name: round(at(name, per_block=False)) for name in fields
            if getattr(c0, name) is not None and getattr(c1, name) is not None}
    return dataclasses.replace(
        c1, **grow, blocks=round(c0.blocks * grid),
        barriers_per_block=round(at("barriers_per_block", per_block=True)),
        worst_bank_conflict=max(c0.worst_bank_conflict, c1.worst_bank_conflict))
