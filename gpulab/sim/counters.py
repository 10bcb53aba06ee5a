"""Counting what a traced launch asks of a GPU's memory, the way a profiler groups it.

    counters = count(trace)                       # requests, sectors, bank conflicts, atomics...
    counters.global_sectors, counters.coalescing  # 32-byte sectors moved; bytes used / moved
    counters.dram_sectors                         # what each block moves from DRAM, once

The 32 threads of a warp run one instruction together, so one dynamic instruction of a warp
(the same line, on the same turn of every loop around it: see loops.py, in one barrier
interval) is one **request**, as Nsight Compute counts them:

    global memory   a request moves every 32-byte sector any of its threads touches
    DRAM            each block's distinct sectors, read once and written once (cost.py says
                    why: the caches keep what one block reuses)
    shared memory   32 banks of 4 bytes; a request takes one pass per distinct word asked of
                    its busiest bank (the same word is broadcast): an n-way bank conflict
    atomics         updates of one address are applied one after another
    barriers        cuda.syncthreads() per block, from the barrier intervals of the trace

gpulab.sim.cost turns these into a modeled time; scaling.py takes them to a full-size launch.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from gpulab.sim.memory import ATOMIC_K, READ_K, WRITE_K

WARP_SIZE = 32
SECTOR_BYTES = 32  # what DRAM and L2 move at a time
BANKS, BANK_BYTES = 32, 4  # shared memory: word w lives in bank w % 32


@dataclass(frozen=True)
class Counters:
    """What one launch asks of memory, counted per warp request (see the module docstring)."""

    blocks: int  # blocks in the grid
    threads_per_block: int
    shared_bytes_per_block: int  # of the shared arrays the kernel declared
    global_load_requests: int
    global_load_sectors: int
    global_store_requests: int
    global_store_sectors: int
    global_bytes_used: int  # distinct bytes each request asked for (atomics: read and written)
    global_atomics: int  # atomic updates of global memory
    global_atomic_requests: int
    global_atomic_sectors: int
    longest_atomic_chain: int  # the most updates of any one global address
    shared_requests: int
    shared_passes: int  # requests plus the extra passes that bank conflicts cost
    worst_bank_conflict: int  # the most passes one request took (1: conflict-free)
    shared_atomics: int
    barriers_per_block: int  # cuda.syncthreads() each block passed
    # Each block's distinct sectors read plus its distinct sectors written (atomics: both),
    # summed over blocks. None (counters made by hand): every request's sectors, no reuse.
    dram_sectors: int | None = None

    @property
    def global_sectors(self) -> int:
        """Sectors moved between SMs and memory: loads, stores and atomics (read and write)."""
        return (self.global_load_sectors + self.global_store_sectors
                + 2 * self.global_atomic_sectors)

    @property
    def global_bytes(self) -> int:
        """Bytes moved: every sector in full."""
        return self.global_sectors * SECTOR_BYTES

    @property
    def dram_bytes(self) -> int:
        """Bytes DRAM moves when each block's reuse is caught by the caches (cost.py)."""
        sectors = self.global_sectors if self.dram_sectors is None else self.dram_sectors
        return sectors * SECTOR_BYTES

    @property
    def coalescing(self) -> float:
        """Bytes the threads used over bytes moved: 1.0 when every fetched byte is used."""
        return self.global_bytes_used / self.global_bytes if self.global_bytes else 1.0

    @property
    def sectors_per_request(self) -> float:
        requests = (self.global_load_requests + self.global_store_requests
                    + self.global_atomic_requests)
        return self.global_sectors / requests if requests else 0.0

    def scaled(self, work: float = 1.0, *, grid: float | None = None,
               loop: float = 1.0) -> Counters:
        """The same kernel on a bigger launch (scaling.py). `work` alone: `work` times as many
        blocks doing the same things (totals grow, per-block figures stay). `grid` and `loop`:
        `grid` times the blocks, each making `loop` times the turns of its main loop."""
        from gpulab.sim.scaling import scaled

        if grid is None:
            return scaled(self, grid=work)
        return scaled(self, grid=grid, loop=loop)

    def table(self) -> str:
        rows = [("global load requests / sectors",
                 f"{self.global_load_requests} / {self.global_load_sectors}"),
                ("global store requests / sectors",
                 f"{self.global_store_requests} / {self.global_store_sectors}"),
                ("global bytes moved (used)", f"{self.global_bytes} ({self.global_bytes_used})"),
                ("DRAM bytes, each block's once", str(self.dram_bytes)),
                ("coalescing (used / moved)", f"{self.coalescing:.0%}"),
                ("shared requests / passes", f"{self.shared_requests} / {self.shared_passes}"),
                ("worst bank conflict", f"{self.worst_bank_conflict}-way"),
                ("atomics global / shared", f"{self.global_atomics} / {self.shared_atomics}"),
                ("longest same-address chain", str(self.longest_atomic_chain)),
                ("barriers per block", str(self.barriers_per_block))]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def count(trace) -> Counters:
    """The Counters of a Trace (gpulab.sim.run_traced)."""
    # A warp request is one dynamic instruction of a warp: the same line and loop turns
    # (`path`, see loops.py), in the same barrier interval; the n-th such access of a thread
    # tells apart the accesses one instruction makes more than once (a slice, a generator).
    nth = Counter()  # (block, thread, epoch, line, path, array, kind) -> executions so far
    requests = defaultdict(set)  # (block, warp, epoch, line, path, array, kind, n) -> flats
    barriers = defaultdict(int)
    chain = Counter()  # (array, flat) -> global atomic updates
    for block, thread, aid, flat, kind, epoch, _, line, _, path in trace.records:
        site = (block, thread, epoch, line, path, aid, kind)
        n = nth[site]
        nth[site] = n + 1
        requests[block, thread // WARP_SIZE, epoch, line, path, aid, kind, n].add(flat)
        barriers[block] = max(barriers[block], epoch)
        if kind == ATOMIC_K and trace.arrays[aid].space == "global":
            chain[aid, flat] += 1
    totals = Counter()
    worst = 1
    dram = set()  # (block, array, reads or writes, sector)
    for (block, _, _, _, _, aid, kind, _), flats in requests.items():
        info = trace.arrays[aid]
        if info.space == "global":
            touched = {flat * info.itemsize // SECTOR_BYTES for flat in flats}
            sectors = len(touched)
            for way in ((READ_K,) if kind == READ_K else (WRITE_K,) if kind == WRITE_K
                        else (READ_K, WRITE_K)):
                dram.update((block, aid, way, s) for s in touched)
            what = {READ_K: "load", WRITE_K: "store", ATOMIC_K: "atomic"}[kind]
            totals[f"{what}_requests"] += 1
            totals[f"{what}_sectors"] += sectors
            # a word that several threads of the warp read is fetched once: it counts once
            totals["used"] += len(flats) * info.itemsize * (2 if kind == ATOMIC_K else 1)
        else:
            words = {flat * info.itemsize // BANK_BYTES for flat in flats}
            passes = max(Counter(w % BANKS for w in words).values())
            totals["shared_requests"] += 1
            totals["shared_passes"] += passes
            worst = max(worst, passes)
    kinds = Counter((trace.arrays[r[2]].space, r[4]) for r in trace.records)
    shared_bytes = sum(math.prod(a.shape) * a.itemsize for a in trace.arrays
                       if a.space == "shared")
    return Counters(
        blocks=math.prod(trace.blocks), threads_per_block=math.prod(trace.threads_per_block),
        shared_bytes_per_block=shared_bytes,
        global_load_requests=totals["load_requests"], global_load_sectors=totals["load_sectors"],
        global_store_requests=totals["store_requests"],
        global_store_sectors=totals["store_sectors"], global_bytes_used=totals["used"],
        global_atomics=kinds["global", ATOMIC_K],
        global_atomic_requests=totals["atomic_requests"],
        global_atomic_sectors=totals["atomic_sectors"],
        longest_atomic_chain=max(chain.values(), default=0),
        shared_requests=totals["shared_requests"], shared_passes=totals["shared_passes"],
        worst_bank_conflict=worst if totals["shared_requests"] else 0,
        shared_atomics=kinds["shared", ATOMIC_K],
        barriers_per_block=max(barriers.values(), default=0), dram_sectors=len(dram))
