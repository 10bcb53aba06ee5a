"""A modeled time for a traced launch on a named GPU, from what it asks of memory (counters.py).

    counters = count(trace)                       # requests, sectors, bank conflicts, atomics...
    cost = model_time(counters.scaled(grid=(4096 / 32) ** 2, loop=4096 / 32), "H100 SXM",
                      flops=2 * m * n * k)
    cost.time_s, cost.bound                       # modeled seconds, and what limits them

The simulator runs one thread at a time, so its wall time says nothing about a GPU (a tiled
kernel is slower there than a naive one: it runs more Python). The trace does say what the GPU
would be asked to do (gpulab.sim.count, the way Nsight Compute groups it), and this module turns
that into time with a model, labelled as such wherever it is shown:

    time = launch overhead
         + max(DRAM bytes / DRAM bandwidth,          each block's distinct sectors, once
               request sectors x 32 B / L2 bandwidth, every sector of every request
               FLOPs / fp32 peak,
               shared passes / (SMs x clock))
           / utilization of the waves (a partial last wave leaves SMs idle)
         + the longest chain of same-address atomics, one per clock
         + barriers per block x waves x BARRIER_CYCLES / clock

Where each figure comes from:
  - DRAM and fp32 rates, SMs, shared memory per SM: the GPU's datasheet (gpulab.gpu_specs).
  - L2 bandwidth: the published bytes per clock where NVIDIA gives them (V100, A100); elsewhere
    L2_OVER_DRAM times the DRAM bandwidth, the lowest ratio among the GPUs with a published
    figure (V100 3.48, A100 80GB 3.54, A100 40GB 4.64).
  - The clock: the fp32 rate over 2 FLOPs x the SM's fp32 lanes (the architecture whitepapers).
  - Shared memory: 32 banks of 4 bytes, one pass per clock per SM (CUDA C++ Programming Guide).
  - Resident threads and blocks per SM, by compute capability: the Programming Guide's table of
    technical specifications; blocks are further limited by shared memory, not by registers.
  - BARRIER_CYCLES: an estimate (the warps of a block drain, then go on), not a measurement.

Assumptions, each stated because it is a choice:
  - Caches: every sector a warp request touches goes through L2 (no L1 hits); DRAM moves each
    block's distinct sectors once (the caches keep what one block reuses, however far apart
    its reuses are), and nothing is shared between blocks through L2.
  - Overlap: DRAM, L2, the math and shared memory all overlap (the max above); atomics and
    barriers do not.
  - The FLOPs are what the caller says (the trace sees memory, not arithmetic).

Known misses, which benchmarks/bench_cost_model.py shows against published measurements:
  - L1 hits: the warps of one block re-reading the same sectors (a naive matmul's rows of B)
    hit in L1 on a GPU; here they go through L2, so such kernels model slower than they run.
    An L1 tier would need an L1 throughput and hit model that published data does not pin
    down without fitting it to the very tables it is checked against.
  - Latency and instruction issue: a kernel limited by shared memory, or with few warps per SM
    to hide latency, runs slower than one pass per clock: it models too fast. Divergence and
    the instructions between memory accesses are not in a memory trace at all.
  - Reuse across blocks: tiles that neighbouring blocks share are read from DRAM once per
    block here, once per wave on a GPU: DRAM-bound kernels with such reuse model slower.
  - Scattered stores: a warp writing 32 sectors for 128 useful bytes (the naive transpose's
    column) costs only L2 bandwidth here, since DRAM writes each block's distinct sectors once.
    On a GPU the partial-sector writes cost more than that (NVIDIA's measurements put the naive
    transpose well below a copy's bandwidth), so such kernels model too fast: lessons/02 shows
    the unpadded tile modeled slower than the naive transpose, where a GPU measures the reverse.
  - Registers: blocks per SM come from threads and shared memory only, so a kernel that needs
    many registers per thread fits fewer blocks on a GPU; the number of waves, and with it the
    idle tail of a partial last wave, can be off either way.
It is for comparing kernels on one GPU, the way lessons/02 and Lab 1 use it, not for predicting
a benchmark; on a GPU, gpulab.timing measures the real thing.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab.hardware import LAUNCH_OVERHEAD_S
from gpulab.sim.counters import (  # noqa: F401  (counting lives in counters.py; same names here)
    BANK_BYTES,
    BANKS,
    SECTOR_BYTES,
    WARP_SIZE,
    Counters,
    count,
)

BARRIER_CYCLES = 20  # one cuda.syncthreads() of a block: the warps drain, then all go on
L2_OVER_DRAM = 3.5  # L2 over DRAM bandwidth where no L2 figure is published (see above)
# Resident threads and blocks per SM by compute capability (CUDA C++ Programming Guide).
RESIDENT_PER_SM = {(7, 0): (2048, 32), (7, 5): (1024, 16), (8, 0): (2048, 32),
                   (8, 6): (1536, 16), (8, 7): (2048, 32), (8, 9): (1536, 24),
                   (9, 0): (2048, 32)}
MAX_THREADS_PER_SM, MAX_BLOCKS_PER_SM = RESIDENT_PER_SM[8, 0]  # for a capability not listed
# fp32 lanes (CUDA cores) per SM, by architecture: the clock is the fp32 rate over them.
FP32_LANES_PER_SM = {"Volta": 64, "Turing": 64, "Ampere": 64, "Ada Lovelace": 128,
                     "Hopper": 128, "Blackwell": 128}
FP32_LANES_GA10X = 128  # Ampere's GA10x chips (A10, A40, RTX 30) doubled the fp32 lanes of GA100


@dataclass(frozen=True)
class ModeledTime:
    """A launch's modeled time on one GPU, term by term (seconds). A model: see the module."""

    gpu: str
    launch_s: float
    dram_s: float  # each block's distinct sectors over DRAM bandwidth
    compute_s: float  # FLOPs over the fp32 peak
    shared_s: float  # shared-memory passes over the SMs' one pass per clock
    utilization: float  # of the waves' block slots: the last wave may leave SMs idle
    atomic_s: float  # the longest same-address chain, one update per clock
    barrier_s: float
    l2_s: float = 0.0  # every request's sectors over L2 bandwidth

    @property
    def terms(self) -> dict[str, float]:
        """Seconds by what they go to; memory (DRAM), L2, compute and shared memory overlap."""
        return {"memory": self.dram_s / self.utilization,
                "L2 cache": self.l2_s / self.utilization,
                "compute": self.compute_s / self.utilization,
                "shared memory": self.shared_s / self.utilization,
                "atomics": self.atomic_s, "barriers": self.barrier_s,
                "launch overhead": self.launch_s}

    @property
    def time_s(self) -> float:
        t = self.terms
        busy = max(t["memory"], t["L2 cache"], t["compute"], t["shared memory"])
        return busy + t["atomics"] + t["barriers"] + t["launch overhead"]

    @property
    def bound(self) -> str:
        """What the largest term is: "memory" (DRAM), "L2 cache", "compute", "shared memory",
        "atomics", "barriers" or "launch overhead"."""
        return max(self.terms, key=self.terms.get)

    def __str__(self) -> str:
        return (f"{self.time_s * 1e6:.1f} us modeled on {self.gpu} ({self.bound}-bound: "
                f"DRAM {self.dram_s * 1e6:.1f} us, L2 {self.l2_s * 1e6:.1f} us, "
                f"compute {self.compute_s * 1e6:.1f} us, "
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


def l2_gbps(gpu) -> float:
    """The L2 bandwidth the model uses, GB/s: the published figure, else L2_OVER_DRAM x DRAM."""
    from gpulab.hardware import get_gpu

    spec = get_gpu(gpu)
    return spec.l2_gbps if spec.l2_gbps is not None else L2_OVER_DRAM * spec.bandwidth_gbps


def blocks_per_sm(counters: Counters, gpu) -> int:
    """Resident blocks per SM, limited by threads, blocks and shared memory (not registers)."""
    from gpulab.hardware import get_gpu

    spec = get_gpu(gpu)
    max_threads, max_blocks = RESIDENT_PER_SM.get(spec.compute_capability,
                                                  (MAX_THREADS_PER_SM, MAX_BLOCKS_PER_SM))
    limits = [max_threads // counters.threads_per_block, max_blocks]
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
        dram_s=counters.dram_bytes / (spec.bandwidth_gbps * 1e9),
        l2_s=counters.global_bytes / (l2_gbps(spec) * 1e9),
        compute_s=flops / (spec.fp32 * 1e12),
        shared_s=counters.shared_passes / (spec.sms * clock),
        utilization=w.utilization,
        atomic_s=counters.longest_atomic_chain / clock,
        barrier_s=counters.barriers_per_block * w.waves_ceil * BARRIER_CYCLES / clock)
