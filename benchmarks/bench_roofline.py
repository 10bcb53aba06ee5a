"""This machine against its own roofline (lessons/01_gpu_architecture.ipynb).

The ceilings are measured here (a large copy, a large matmul); on a GPU the spec sheet's dense
peaks are reported next to them. Targets are ratios measured in the same run:

    a + b bandwidth / copy bandwidth     an elementwise op should stream nearly as fast as a copy
    matmul n/2 / matmul n                a half-size matmul should still be near the compute roof
    copy / datasheet bandwidth (GPU)     how much of the datasheet a copy reaches
    bf16 matmul / datasheet bf16 (GPU)   how much of the dense tensor-core peak cuBLAS reaches
"""

from __future__ import annotations

import torch
from common import Row

import gpulab
from gpulab import hardware as hw
from gpulab.timing import benchmark

NAME = "roofline"


def _ratio(metric: str, value: float, low: float, note: str) -> Row:
    return Row(NAME, metric, value, "x", target=f">= {low}x", ok=value >= low, note=note)


def run(quick: bool = False) -> list[Row]:
    device = "cuda" if gpulab.runner.device_kind == "cuda" else "cpu"
    on_gpu = device == "cuda"
    copy_mb = (256 if quick else 1024) if on_gpu else (32 if quick else 128)
    matmul_n = (4096 if quick else 8192) if on_gpu else (1024 if quick else 2048)
    dtypes = ("fp32", "bf16") if on_gpu else ("fp32",)
    roof = hw.measure_roofline(device, dtypes=dtypes, copy_mb=copy_mb, matmul_n=matmul_n)
    note = f"{roof.name}, copy {copy_mb} MB, matmul {matmul_n}"
    rows = [Row(NAME, "copy bandwidth (ceiling)", roof.bandwidth_gbps, "GB/s", note=note),
            Row(NAME, "fp32 matmul (ceiling)", roof.fp32, "TFLOP/s", note=note),
            Row(NAME, "fp32 ridge point", hw.ops_per_byte(roof, "fp32"), "FLOP/byte", note=note)]

    n = copy_mb * 2**20 // 4
    a, b = torch.randn(n, device=device), torch.randn(n, device=device)
    out = torch.empty_like(a)
    t = benchmark(torch.add, a, b, out=out, warmup=2, repeat=5)
    add_gbps = 3 * a.nbytes / t.min_s / 1e9  # best run, as the ceiling is a best run
    rows.append(_ratio("a + b / copy bandwidth", add_gbps / roof.bandwidth_gbps, 0.6,
                       f"{add_gbps:.1f} GB/s on {n:,} fp32 elements"))

    half = matmul_n // 2
    x = torch.randn(half, half, device=device)
    t = benchmark(torch.matmul, x, x, warmup=2, repeat=5)
    half_tflops = 2 * half**3 / t.min_s / 1e12
    rows.append(_ratio(f"fp32 matmul {half} / matmul {matmul_n}", half_tflops / roof.fp32, 0.5,
                       f"{half_tflops:.3g} TFLOP/s"))

    spec = hw.this_machine("cuda") if on_gpu else None
    if spec is not None:
        rows.append(_ratio("copy / datasheet bandwidth", roof.bandwidth_gbps / spec.bandwidth_gbps,
                           0.7, f"datasheet {spec.bandwidth_gbps:g} GB/s ({spec.name})"))
        if spec.bf16 is not None and roof.bf16 is not None:
            rows.append(_ratio("bf16 matmul / datasheet dense bf16", roof.bf16 / spec.bf16, 0.5,
                               f"{roof.bf16:.0f} of {spec.bf16:g} TFLOP/s ({spec.name})"))
    return rows
