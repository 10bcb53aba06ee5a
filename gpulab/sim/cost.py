"""What a traced launch asks of a GPU's memory system, and a modeled time for it on a named GPU.

    counters = count(trace)                       # requests, sectors, bank conflicts, atomics...
    counters.global_sectors, counters.coalescing  # 32-byte sectors moved; bytes used / moved
    cost = model_time(counters.scaled(4096), "H100 SXM", flops=2 * m * n * k)
    cost.time_s, cost.bound                       # modeled seconds, and what limits them

The simulator runs one thread at a time, so its wall time says nothing about a GPU (a tiled
kernel is slower there than a naive one: it runs more Python). The trace does say what the GPU
would be asked to do, and that is what this module counts, the way a profiler such as Nsight
Compute groups it: the 32 threads of a warp run one instruction together, so the n-th time the
threads of one warp run a given load or store (in one barrier interval) is one **request**.

    global memory   a request moves every 32-byte sector any of its threads touches
    shared memory   32 banks of 4 bytes; a request takes one pass per distinct word asked of
                    its busiest bank (the same word is broadcast): an n-way bank conflict
    atomics         updates of one address are applied one after another
    barriers        cuda.syncthreads() per block, from the barrier intervals of the trace

`model_time` turns counters into time with a model, labelled as such wherever it is shown:

    time = launch overhead
         + max(sectors x 32 B / DRAM bandwidth, FLOPs / fp32 peak, shared passes / (SMs x clock))
           / utilization of the waves (a partial last wave leaves SMs idle)
         + the longest chain of same-address atomics, one per clock
         + barriers per block x waves x BARRIER_CYCLES / clock

Assumptions, each an upper or lower bound on purpose: every sector a request touches comes
from DRAM (no L1/L2 hits: caches make uncoalesced and naive kernels faster than modeled); the
FLOPs are what the caller says (the trace sees memory, not arithmetic); every memory request
overlaps with the math (the max above); blocks per SM are limited by threads and shared memory,
not registers; the clock is the fp32 rate over the SM's fp32 lanes. It is for comparing two
kernels on one GPU, the way lessons/02 and Lab 1 use it, not for predicting a benchmark; on a
GPU, gpulab.timing measures the real thing.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from gpulab.hardware import LAUNCH_OVERHEAD_S
from gpulab.sim.memory import ATOMIC_K, READ_K, WRITE_K

WARP_SIZE = 32
SECTOR_BYTES = 32  # what DRAM and L2 move at a time
BANKS, BANK_BYTES = 32, 4  # shared memory: word w lives in bank w % 32
BARRIER_CYCLES = 20  # one cuda.syncthreads() of a block: the warps drain, then all go on
MAX_THREADS_PER_SM, MAX_BLOCKS_PER_SM = 2048, 32  # compute capability 8.0 and later
# fp32 lanes (CUDA cores) per SM, by architecture: the clock is the fp32 rate over them.
FP32_LANES_PER_SM = {"Volta": 64, "Turing": 64, "Ampere": 64, "Ada Lovelace": 128,
                     "Hopper": 128, "Blackwell": 128}
FP32_LANES_GA10X = 128  # Ampere's GA10x chips (A10, A40, RTX 30) doubled the fp32 lanes of GA100


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
    def coalescing(self) -> float:
        """Bytes the threads used over bytes moved: 1.0 when every fetched byte is used."""
        return self.global_bytes_used / self.global_bytes if self.global_bytes else 1.0

    @property
    def sectors_per_request(self) -> float:
        requests = (self.global_load_requests + self.global_store_requests
                    + self.global_atomic_requests)
        return self.global_sectors / requests if requests else 0.0

    def scaled(self, work: float) -> Counters:
        """The same kernel on `work` times as many blocks doing the same things: totals grow,
        per-block and per-request figures stay (a grid of tiles repeats its pattern)."""
        per_item = {"threads_per_block", "shared_bytes_per_block", "worst_bank_conflict",
                    "barriers_per_block"}
        grow = {f.name: round(getattr(self, f.name) * work)
                for f in dataclasses.fields(self) if f.name not in per_item}
        grow["longest_atomic_chain"] = round(self.longest_atomic_chain * work)  # one address
        return dataclasses.replace(self, **grow)

    def table(self) -> str:
        rows = [("global load requests / sectors",
                 f"{self.global_load_requests} / {self.global_load_sectors}"),
                ("global store requests / sectors",
                 f"{self.global_store_requests} / {self.global_store_sectors}"),
                ("global bytes moved (used)", f"{self.global_bytes} ({self.global_bytes_used})"),
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
    for (_, _, _, _, _, aid, kind, _), flats in requests.items():
        info = trace.arrays[aid]
        if info.space == "global":
            sectors = len({flat * info.itemsize // SECTOR_BYTES for flat in flats})
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
        barriers_per_block=max(barriers.values(), default=0))


@dataclass(frozen=True)
class ModeledTime:
    """A launch's modeled time on one GPU, term by term (seconds). A model: see the module."""

    gpu: str
    launch_s: float
    dram_s: float  # sectors over DRAM bandwidth
    compute_s: float  # FLOPs over the fp32 peak
    shared_s: float  # shared-memory passes over the SMs' one pass per clock
    utilization: float  # of the waves' block slots: the last wave may leave SMs idle
    atomic_s: float  # the longest same-address chain, one update per clock
    barrier_s: float

    @property
    def terms(self) -> dict[str, float]:
        """Seconds by what they go to; memory, compute and shared memory overlap each other."""
        return {"memory": self.dram_s / self.utilization,
                "compute": self.compute_s / self.utilization,
                "shared memory": self.shared_s / self.utilization,
                "atomics": self.atomic_s, "barriers": self.barrier_s,
                "launch overhead": self.launch_s}

    @property
    def time_s(self) -> float:
        t = self.terms
        busy = max(t["memory"], t["compute"], t["shared memory"])
        return busy + t["atomics"] + t["barriers"] + t["launch overhead"]

    @property
    def bound(self) -> str:
        """What the largest term is: "memory", "compute", "shared memory", "atomics",
        "barriers" or "launch overhead"."""
        return max(self.terms, key=self.terms.get)

    def __str__(self) -> str:
        return (f"{self.time_s * 1e6:.1f} us modeled on {self.gpu} ({self.bound}-bound: "
                f"DRAM {self.dram_s * 1e6:.1f} us, compute {self.compute_s * 1e6:.1f} us, "
                f"shared {self.shared_s * 1e6:.1f} us at {self.utilization:.0%} of the "
                f"waves' slots; atomics {self.atomic_s * 1e6:.1f} us, barriers "
                f"{self.barrier_s * 1e6:.1f} us, launch {self.launch_s * 1e6:.0f} us)")


def clock_hz(gpu) -> float:
    """The SM clock the model uses: the fp32 rate over 2 FLOPs x the SMs' fp32 lanes."""
    from gpulab.hardware import get_gpu

    spec = get_gpu(gpu)
    lanes = FP32_LANES_PER_SM.get(spec.architecture)
    if spec.architecture == "Ampere" and spec.compute_capability != (8, 0):
        lanes = FP32_LANES_GA10X
    if spec.vendor != "NVIDIA" or lanes is None:
        raise ValueError(f"the kernel cost model is for NVIDIA GPUs since Volta; {spec.name} "
                         f"is {spec.vendor} {spec.architecture}")
    return spec.fp32 * 1e12 / (2 * spec.sms * lanes)


def blocks_per_sm(counters: Counters, gpu) -> int:
    """Resident blocks per SM, limited by threads, blocks and shared memory (not registers)."""
    from gpulab.hardware import get_gpu

    spec = get_gpu(gpu)
    limits = [MAX_THREADS_PER_SM // counters.threads_per_block, MAX_BLOCKS_PER_SM]
    if counters.shared_bytes_per_block:
        limits.append(spec.smem_per_sm_kb * 1024 // counters.shared_bytes_per_block)
    return max(1, min(limits))


def model_time(counters: Counters, gpu, flops: float = 0.0) -> ModeledTime:
    """The modeled time of a launch with `counters` (and `flops` of fp32 math) on `gpu`."""
    from gpulab.hardware import get_gpu, waves

    spec = get_gpu(gpu)
    clock = clock_hz(spec)
    w = waves(counters.blocks, spec, blocks_per_sm(counters, spec))
    return ModeledTime(
        gpu=spec.name, launch_s=LAUNCH_OVERHEAD_S,
        dram_s=counters.global_bytes / (spec.bandwidth_gbps * 1e9),
        compute_s=flops / (spec.fp32 * 1e12),
        shared_s=counters.shared_passes / (spec.sms * clock),
        utilization=w.utilization,
        atomic_s=counters.longest_atomic_chain / clock,
        barrier_s=counters.barriers_per_block * w.waves_ceil * BARRIER_CYCLES / clock)
