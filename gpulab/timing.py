"""Timing code honestly: warm up, synchronize, repeat, report the median.

On a GPU, kernels are queued and the host returns at once, so a wall-clock timer around a launch
measures the launch, not the work. `benchmark` records CUDA events on the stream and waits for
them; on the CPU it uses time.perf_counter. Either way the first calls (compilation, caches,
allocator growth) are thrown away as warm-up.

    t = benchmark(torch.matmul, a, b)
    t.median_s, t.tflops(2 * n**3), t.gbps(3 * n * n * 4)

Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeat` timed calls, after warm-up."""

    median_s: float
    min_s: float
    max_s: float
    repeat: int
    device: str  # "cuda" when timed with CUDA events, else "cpu"

    def gbps(self, n_bytes: float) -> float:
        """Achieved bandwidth in GB/s (1e9 bytes/s) for `n_bytes` moved per call, at the median."""
        return n_bytes / self.median_s / 1e9

    def tflops(self, n_flops: float) -> float:
        """Achieved TFLOP/s (1e12 FLOP/s) for `n_flops` per call, at the median."""
        return n_flops / self.median_s / 1e12

    def __str__(self) -> str:
        return (f"median {format_seconds(self.median_s)} "
                f"(min {format_seconds(self.min_s)}, max {format_seconds(self.max_s)}, "
                f"{self.repeat} runs on {self.device})")


def format_seconds(seconds: float) -> str:
    """1.2e-5 -> '12.0 us': the unit a person would pick."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.1f} {unit}"
    return f"{seconds / 1e-9:.0f} ns"


def _uses_cuda(args) -> bool:
    """True when any argument is a CUDA tensor or array, so the call is asynchronous."""
    for a in args:
        device = getattr(a, "device", None)
        if getattr(device, "type", None) == "cuda" or hasattr(a, "__cuda_array_interface__"):
            return True
    return False


def benchmark(fn, *args, warmup: int = 3, repeat: int = 10, cuda: bool | None = None,
              **kwargs) -> Timing:
    """Time `fn(*args, **kwargs)`: `warmup` untimed calls, then `repeat` timed ones.

    cuda=None decides from the arguments (any CUDA tensor or device array); pass cuda=True to
    time work that launches kernels on arrays it creates itself.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if cuda is None:
        cuda = _uses_cuda(list(args) + list(kwargs.values()))
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = _time_cuda(fn, args, kwargs, repeat) if cuda else _time_cpu(fn, args, kwargs, repeat)
    return Timing(statistics.median(times), min(times), max(times), repeat,
                  "cuda" if cuda else "cpu")


def _time_cpu(fn, args, kwargs, repeat) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return times


def _time_cuda(fn, args, kwargs, repeat) -> list[float]:
    import torch

    torch.cuda.synchronize()  # nothing queued earlier may leak into the first measurement
    pairs = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args, **kwargs)
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()  # events complete only once the queued kernels have run
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]  # elapsed_time is in milliseconds
