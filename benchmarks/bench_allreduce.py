"""gpulab's ring all-reduce (send/recv in Python) against torch's dist.all_reduce
(lessons/04_distributed_fundamentals.ipynb).

Both run in the same two gloo ranks, interleaved call by call, so machine noise hits them
alike; a call's time is the slower rank's, and the figure is the median over calls. Target:

    ring_all_reduce / dist.all_reduce     <= 1.5x: the same algorithm, with Python driving the
                                          steps; a big gap would mean a schedule that idles
The binomial tree is reported beside it (no target: it sends the whole buffer every round).
"""

from __future__ import annotations

import statistics

from common import Row

from gpulab.distributed import run_on_ranks
from gpulab.distributed.cost_model import algbw, busbw

NAME = "allreduce"
WORLD_SIZE = 2


def _time_on_rank(rank, world_size, n, repeat, warmup):
    """Per call, this rank's seconds for ring, tree and dist.all_reduce, interleaved."""
    import time

    import torch
    import torch.distributed as dist

    from gpulab.distributed.allreduce import ring_all_reduce, tree_all_reduce

    # Small integers: every summation order gives the same floats, so results compare exactly.
    x = torch.randint(-8, 8, (n,), generator=torch.Generator().manual_seed(rank)).float()
    want = x.clone()
    dist.all_reduce(want)
    fns = {"ring": ring_all_reduce, "tree": tree_all_reduce, "torch": dist.all_reduce}
    for name, fn in fns.items():
        got = x.clone()
        fn(got)  # in place, like dist.all_reduce (which returns None)
        if not torch.equal(got, want):
            raise AssertionError(f"{name} all-reduce differs from dist.all_reduce")
    times = {name: [] for name in fns}
    buffers = {name: x.clone() for name in fns}
    for i in range(warmup + repeat):
        for name, fn in fns.items():
            buffers[name].copy_(x)
            dist.barrier()  # start together: a call's time is not another rank's lateness
            start = time.perf_counter()
            fn(buffers[name])
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def run(quick: bool = False) -> list[Row]:
    n = (1 << 20) if quick else (16 << 20)  # float32 elements: 4 MB or 64 MB
    repeat, warmup = (9, 2) if quick else (7, 2)
    per_rank = run_on_ranks(_time_on_rank, WORLD_SIZE, n, repeat, warmup, backend="gloo",
                            timeout_s=600)
    median = {name: statistics.median(max(ts) for ts in zip(*(r[name] for r in per_rank),
                                                            strict=True))
              for name in per_rank[0]}
    n_bytes = 4 * n
    note = f"gloo, {WORLD_SIZE} ranks, {n:,} fp32 ({n_bytes / 2**20:.0f} MiB), median of {repeat}"
    ratio = median["ring"] / median["torch"]
    rows = [Row(NAME, "ring_all_reduce / dist.all_reduce time", ratio, "x", target="<= 1.5x",
                ok=ratio <= 1.5, note=note),
            Row(NAME, "tree_all_reduce / dist.all_reduce time", median["tree"] / median["torch"],
                "x", note=note)]
    for name in ("torch", "ring"):
        bw = busbw("all_reduce", algbw(n_bytes, median[name]), WORLD_SIZE)
        rows.append(Row(NAME, f"{name} all-reduce bus bandwidth", bw, "GB/s", note=note))
    return rows
