"""The performance model: roofline, arithmetic intensity, waves and the tail effect.

A kernel's time is bounded below by two things: the FLOPs it does over the GPU's peak FLOP/s,
and the bytes it moves to and from device memory over the memory bandwidth. Whichever is
larger is the regime it is in (compute-bound or memory-bound); a kernel far slower than both is
in the third regime, overhead-bound (launches, Python, synchronisation).

    gpu = get_gpu("A100 80GB SXM")
    ops_per_byte(gpu, "bf16")                       # 153: the ridge point, FLOP per byte
    bound(*gemm_flops_bytes(4096, 4096, 4096, "bf16"), gpu, "bf16").regime    # "compute"
    waves(144, gpu).utilization                     # 0.67: 144 blocks on 108 SMs

The spec sheet (GPUSpec, get_gpu, list_gpus) lives in gpulab/gpu_specs.py.
Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

# The spec sheet, re-exported so that lessons need one import: `from gpulab import hardware`.
from gpulab.gpu_specs import DTYPES, GPUS, PCIE_X16_GBPS, GPUSpec, dtype_key, get_gpu, list_gpus

__all__ = ["DTYPES", "GPUS", "PCIE_X16_GBPS", "GPUSpec", "dtype_key", "get_gpu", "list_gpus",
           "DTYPE_BYTES", "ops_per_byte", "attainable_tflops", "Bound", "bound",
           "elementwise_intensity", "gemm_flops_bytes", "gemm_intensity", "layernorm_flops_bytes",
           "layernorm_intensity", "softmax_flops_bytes", "softmax_intensity", "Waves", "waves",
           "gemm_tiles", "tile_utilization", "gemm_waves", "MeasuredRoofline", "measure_roofline",
           "TimedOp", "time_ops",
           "this_machine"]

# Bytes per element in memory. tf32 is a tensor-core math mode: its operands are stored as fp32.
# A kernel launch's fixed cost on a GPU: the host's launch call and the GPU starting the grid,
# a few microseconds (CUDA's own figure; what a tiny kernel's time is made of).
LAUNCH_OVERHEAD_S = 5e-6
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def _roof(gpu):
    """A GPUSpec or a MeasuredRoofline as given, or the spec-sheet row for a name."""
    return get_gpu(gpu) if isinstance(gpu, str) else gpu


# --- the roofline ------------------------------------------------------------------------------

def ops_per_byte(gpu, dtype: str) -> float:
    """The ridge point, in FLOP/byte: peak FLOP/s over memory bandwidth. An op that does fewer
    FLOPs per byte it moves is memory-bound on this GPU; one that does more is compute-bound."""
    g = _roof(gpu)
    return g.peak_tflops(dtype) * 1e12 / (g.bandwidth_gbps * 1e9)


def attainable_tflops(gpu, dtype: str, intensity):
    """The roofline: min(peak, bandwidth x intensity), in TFLOP/s, for an op doing `intensity`
    FLOP per byte (a number, or an array for a whole curve)."""
    g = _roof(gpu)
    memory_roof = g.bandwidth_gbps * np.asarray(intensity, dtype=float) / 1e3  # GFLOP/s -> TFLOP/s
    roof = np.minimum(g.peak_tflops(dtype), memory_roof)
    return float(roof) if roof.ndim == 0 else roof


@dataclass(frozen=True)
class Bound:
    """What the roofline says about one op on one GPU."""

    regime: str  # "compute" or "memory": the roof that limits this op
    time_s: float  # lower bound on its run time: max(compute_s, memory_s)
    intensity: float  # FLOP per byte moved
    compute_s: float  # FLOPs / peak FLOP/s
    memory_s: float  # bytes / bandwidth
    ridge: float  # the GPU's ops_per_byte: where the two regimes meet

    def efficiency(self, measured_s: float) -> float:
        """Fraction of the roofline reached by a run that took `measured_s` ("speed of light").
        Far below 1 for an op that is neither: it is overhead-bound."""
        return self.time_s / measured_s


def bound(flops: float, n_bytes: float, gpu, dtype: str) -> Bound:
    """Is an op doing `flops` FLOPs and moving `n_bytes` bytes compute- or memory-bound on `gpu`
    in `dtype`, and how fast could it possibly run?"""
    g = _roof(gpu)
    compute_s = flops / (g.peak_tflops(dtype) * 1e12)
    memory_s = n_bytes / (g.bandwidth_gbps * 1e9)
    return Bound(regime="compute" if compute_s >= memory_s else "memory",
                 time_s=max(compute_s, memory_s), intensity=flops / n_bytes,
                 compute_s=compute_s, memory_s=memory_s, ridge=ops_per_byte(g, dtype))


# --- arithmetic intensity of common ops --------------------------------------------------------
# FLOPs count additions and multiplications (a multiply-add is 2); bytes count the least
# traffic to device memory, as if each input were read once and each output written once. Real
# kernels move at least this much, so the intensities are upper bounds.

def elementwise_intensity(n_inputs: int = 1, n_outputs: int = 1, dtype: str = "fp32",
                          flops_per_element: float = 1) -> float:
    """FLOP/byte of an elementwise op (y = a + b: 2 inputs, 1 output, 1 FLOP). The same at every
    size: no element is used twice, so there is no reuse to exploit."""
    return flops_per_element / ((n_inputs + n_outputs) * DTYPE_BYTES[dtype_key(dtype)])


def gemm_flops_bytes(m: int, n: int, k: int, dtype: str = "bf16") -> tuple[int, int]:
    """(FLOPs, bytes) of C = A @ B with A (m, k), B (k, n), C (m, n): m*n*k multiply-adds, and
    A and B read once and C written once."""
    return 2 * m * n * k, (m * k + k * n + m * n) * DTYPE_BYTES[dtype_key(dtype)]


def gemm_intensity(m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """FLOP/byte of a matmul: grows with the sizes (about n/3 FLOP per element for square n)."""
    flops, n_bytes = gemm_flops_bytes(m, n, k, dtype)
    return flops / n_bytes


def layernorm_flops_bytes(rows: int, hidden: int, dtype: str = "fp32") -> tuple[int, int]:
    """(FLOPs, bytes) of LayerNorm over the last dim of x (rows, hidden), in one fused pass.
    FLOPs per element: mean 1 (add), variance 3 (subtract, square, add), normalise 2 (subtract,
    multiply by 1/std), scale and shift 2; the per-row rsqrt is negligible. Bytes: x read and y
    written once, the weight and bias (hidden,) read once."""
    size = DTYPE_BYTES[dtype_key(dtype)]
    return 8 * rows * hidden, (2 * rows * hidden + 2 * hidden) * size


def layernorm_intensity(rows: int, hidden: int, dtype: str = "fp32") -> float:
    """FLOP/byte of LayerNorm: about 8 FLOPs per 2 elements moved, whatever the sizes."""
    flops, n_bytes = layernorm_flops_bytes(rows, hidden, dtype)
    return flops / n_bytes


def softmax_flops_bytes(rows: int, cols: int, dtype: str = "fp32") -> tuple[int, int]:
    """(FLOPs, bytes) of softmax over the last dim of x (rows, cols), in one fused pass.
    FLOPs per element: max 1 (compare), subtract 1, exp 1 (several instructions on the special
    function unit, counted as one), sum 1, divide 1. Bytes: x read once, y written once."""
    return 5 * rows * cols, 2 * rows * cols * DTYPE_BYTES[dtype_key(dtype)]


def softmax_intensity(rows: int, cols: int, dtype: str = "fp32") -> float:
    """FLOP/byte of softmax: 5 FLOPs per 2 elements moved, whatever the sizes."""
    flops, n_bytes = softmax_flops_bytes(rows, cols, dtype)
    return flops / n_bytes


# --- waves and the tail effect -----------------------------------------------------------------

@dataclass(frozen=True)
class Waves:
    """How a grid of equal blocks fills the SMs: in rounds ("waves") of `slots` blocks each."""

    n_blocks: int  # blocks in the grid
    slots: int  # blocks resident at once: SMs x blocks_per_sm
    waves: float  # n_blocks / slots
    waves_ceil: int  # rounds the GPU actually runs: the last one may be partly idle
    tail_blocks: int  # blocks in the last round (== slots when it is full)
    utilization: float  # useful work / scheduled slots: n_blocks / (waves_ceil * slots)


def waves(n_blocks: int, gpu, blocks_per_sm: int = 1) -> Waves:
    """Waves of a grid of `n_blocks` equal blocks when each SM holds `blocks_per_sm` at once.
    144 blocks on an A100's 108 SMs: 1.33 waves, run as 2, so 2/3 of the slots do work."""
    if n_blocks < 1 or blocks_per_sm < 1:
        raise ValueError(f"need n_blocks >= 1 and blocks_per_sm >= 1, got {n_blocks}, "
                         f"{blocks_per_sm}")
    slots = _roof(gpu).sms * blocks_per_sm
    waves_ceil = math.ceil(n_blocks / slots)
    return Waves(n_blocks=n_blocks, slots=slots, waves=n_blocks / slots, waves_ceil=waves_ceil,
                 tail_blocks=n_blocks - (waves_ceil - 1) * slots,
                 utilization=n_blocks / (waves_ceil * slots))


def gemm_tiles(m: int, n: int, tile_m: int = 128, tile_n: int = 128) -> int:
    """Output tiles of an (m, n) matmul result, one thread block each: ceil(m/tile_m) x
    ceil(n/tile_n). Edge tiles are computed whole even when only partly inside C."""
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def tile_utilization(m: int, n: int, tile_m: int = 128, tile_n: int = 128) -> float:
    """Tile quantization: the useful fraction of the tiles' work, m*n / (tiles * tile area)."""
    return m * n / (gemm_tiles(m, n, tile_m, tile_n) * tile_m * tile_n)


def gemm_waves(m: int, n: int, gpu, tile_m: int = 128, tile_n: int = 128,
               blocks_per_sm: int = 1) -> Waves:
    """Waves of a tiled matmul producing an (m, n) result: one block per output tile."""
    return waves(gemm_tiles(m, n, tile_m, tile_n), gpu, blocks_per_sm)


# --- the machine running this ------------------------------------------------------------------

@dataclass(frozen=True)
class MeasuredRoofline:
    """Ceilings MEASURED on this machine, not taken from a datasheet: the bandwidth of a large
    copy and the FLOP/s of a large matmul. It stands wherever a GPUSpec goes in a roofline."""

    name: str  # e.g. "this CPU (measured)"
    device: str  # the torch device type it was measured on
    bandwidth_gbps: float  # best large-copy bandwidth, GB/s (bytes read + bytes written)
    fp32: float | None = None  # best fp32 matmul, TFLOP/s; None when not measured
    bf16: float | None = None  # best bf16 matmul, TFLOP/s; None when not measured
    measured: bool = True  # plots label it as a measurement

    def peak_tflops(self, dtype: str) -> float:
        """The measured matmul ceiling for `dtype`; ValueError when it was not measured."""
        value = getattr(self, dtype_key(dtype), None)
        if value is None:
            raise ValueError(f"{self.name}: no {dtype_key(dtype)} ceiling was measured; "
                             "pass dtypes=(..., 'bf16') to measure_roofline.")
        return value


MATMUL_BUDGET_S = 0.25  # measure_roofline: no larger matmul once one takes this long


def large_copy(device: str = "cpu", copy_mb: int | None = None):
    """(a call that copies copy_mb MB, the bytes it moves): the ceilings' bandwidth probe. Each
    byte is read once and written once; the default size is well past most machines' caches."""
    import torch

    copy_mb = copy_mb or (1024 if device == "cuda" else 128)
    src = torch.empty(copy_mb * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return functools.partial(dst.copy_, src), 2 * src.nbytes


def measure_roofline(device: str = "cpu", dtypes=("fp32",), copy_mb: int | None = None,
                     matmul_n: int | None = None) -> MeasuredRoofline:
    """Measure this machine's ceilings with torch: the bandwidth of a large copy, and the best
    FLOP/s of square matmuls of size matmul_n/8, /4, /2 and matmul_n (the largest is not always
    the fastest: caches, and other programs, get in the way). Best of a few runs each, after
    warm-up. The sizes stop growing once one matmul takes over MATMUL_BUDGET_S: a CPU without
    bf16 instructions runs bf16 matmuls at well under 1 GFLOP/s, a minute for one of 2048. The
    default sizes take a few seconds on a laptop CPU."""
    import torch

    from gpulab.timing import benchmark

    on_gpu = device == "cuda"
    matmul_n = matmul_n or (8192 if on_gpu else 2048)  # big enough to reach the peak
    copy, moved = large_copy(device, copy_mb)
    bandwidth_gbps = moved / benchmark(copy, warmup=2, repeat=5, cuda=on_gpu).min_s / 1e9
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    keys = {dtype_key(d) for d in dtypes} | {"fp32"}
    if not keys <= torch_dtypes.keys():
        raise ValueError(f"measure_roofline measures fp32 and bf16, not {sorted(keys)}")
    peaks = {}
    for key in sorted(keys):
        peaks[key] = 0.0
        for n in sorted({max(matmul_n // d, 1) for d in (8, 4, 2, 1)}):
            a = torch.randn(n, n, device=device).to(torch_dtypes[key])
            t = benchmark(torch.matmul, a, a, warmup=1, repeat=2, cuda=on_gpu)
            peaks[key] = max(peaks[key], 2 * n**3 / t.min_s / 1e12)
            if t.min_s > MATMUL_BUDGET_S:  # the next size would take 8 times as long
                break
    name = torch.cuda.get_device_name() if on_gpu else "this CPU"
    return MeasuredRoofline(name=f"{name} (measured)", device=device,
                            bandwidth_gbps=bandwidth_gbps, fp32=peaks["fp32"],
                            bf16=peaks.get("bf16"))


@dataclass(frozen=True)
class TimedOp:
    """One op timed by time_ops: its work and its best run."""

    label: str
    flops: float
    n_bytes: float
    time_s: float  # the best run: other programs can only make a run slower

    @property
    def intensity(self) -> float:
        return self.flops / self.n_bytes

    @property
    def tflops(self) -> float:
        return self.flops / self.time_s / 1e12

    @property
    def gbps(self) -> float:
        return self.n_bytes / self.time_s / 1e9


def time_ops(ops: dict, device: str = "cpu", dtype: str = "fp32", rounds: int = 3,
             copy_mb: int | None = None) -> tuple[list[TimedOp], MeasuredRoofline]:
    """Time `ops` (label -> (fn, FLOPs, bytes moved)) and this machine's ceilings together: a
    large copy and every op in turn, round after round, each keeping its best run. The roofs
    are the best the machine showed in those same moments: the bandwidth of the copy or of any
    op, whichever is higher, and the FLOP/s of the fastest op (give it a large matmul). Ceilings
    measured at another moment than the ops can sit below them on a busy machine (an op "at
    733% of its bound"); measured together, no op lands above its own roof."""
    import torch

    from gpulab.timing import benchmark

    on_gpu = device == "cuda"
    if dtype_key(dtype) not in ("fp32", "bf16"):
        raise ValueError(f"time_ops measures fp32 or bf16 ceilings, not {dtype_key(dtype)}")
    copy, moved = large_copy(device, copy_mb)
    best_copy_s, best = float("inf"), dict.fromkeys(ops, float("inf"))
    for _ in range(rounds):
        best_copy_s = min(best_copy_s, benchmark(copy, warmup=1, repeat=2, cuda=on_gpu).min_s)
        for label, (fn, _, _) in ops.items():
            best[label] = min(best[label], benchmark(fn, warmup=1, repeat=2, cuda=on_gpu).min_s)
    timed = [TimedOp(label, flops, n_bytes, best[label])
             for label, (_, flops, n_bytes) in ops.items()]
    bandwidth = max([moved / best_copy_s / 1e9, *(op.gbps for op in timed)])
    peak = max(op.tflops for op in timed)
    name = torch.cuda.get_device_name() if on_gpu else "this CPU"
    roof = MeasuredRoofline(name=f"{name} (measured)", device=device, bandwidth_gbps=bandwidth,
                            **{dtype_key(dtype): peak})
    return timed, roof


def this_machine(device: str | None = None):
    """The roofline of the machine running this. On a CUDA device: its spec-sheet row, found by
    torch.cuda.get_device_name() (None when the table lacks it). Anywhere else: ceilings
    measured here on the CPU (a MeasuredRoofline)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        try:
            return get_gpu(torch.cuda.get_device_name())
        except KeyError:
            return None
    return measure_roofline("cpu")
