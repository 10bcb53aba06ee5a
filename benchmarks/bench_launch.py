"""What a launch costs: run_on_ranks with ranks forked from the fork server against ranks started
as fresh interpreters (GPULAB_FRESH_RANKS=1), in the same run
(gpulab/distributed/runtime/forkserver.py).

Each launch runs a function that all-reduces one number on 2 gloo ranks (Launcher.run); the
launches alternate between the two ways, after one warm-up launch each (the server's own start,
paid once per process, is the warm-up's). Target:

    forked launch / fresh launch     <= 0.5x: a fresh interpreter spends 2-3 s of CPU importing
                                     torch, a forked rank none; the rest (the process group,
                                     the launcher's files) is the same for both
"""

from __future__ import annotations

import os
import statistics
import time

from common import Row

from gpulab.distributed import Launcher
from gpulab.env import FRESH_RANKS_VARIABLE as OFF_VARIABLE

NAME = "launch"
WORLD_SIZE = 2


def _all_reduce_one(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _launch_s(fresh: bool) -> float:
    before = os.environ.get(OFF_VARIABLE)
    if fresh:
        os.environ[OFF_VARIABLE] = "1"
    else:
        os.environ.pop(OFF_VARIABLE, None)
    try:
        start = time.perf_counter()
        values = Launcher(WORLD_SIZE, backend="gloo").run(_all_reduce_one)
        if values != [float(WORLD_SIZE)] * WORLD_SIZE:
            raise AssertionError(f"the all-reduce gave {values}")
        return time.perf_counter() - start
    finally:
        os.environ.pop(OFF_VARIABLE, None)
        if before is not None:
            os.environ[OFF_VARIABLE] = before


def run(quick: bool = False) -> list[Row]:
    repeat = 1 if quick else 7
    times = {"forked": [], "fresh": []}
    for i in range(repeat + 1):
        for way in times:
            seconds = _launch_s(fresh=way == "fresh")
            if i:  # the first of each: the warm-up
                times[way].append(seconds)
    median = {way: statistics.median(ts) for way, ts in times.items()}
    note = f"gloo, {WORLD_SIZE} ranks, median of {repeat} launches each, alternating"
    ratio = median["forked"] / median["fresh"]
    return [Row(NAME, "forked / fresh-interpreter launch time", ratio, "x", target="<= 0.5x",
                ok=ratio <= 0.5, note=note),
            Row(NAME, "forked launch", median["forked"], "s", note=note),
            Row(NAME, "fresh-interpreter launch", median["fresh"], "s", note=note)]
