"""Roofline explorer: pick a GPU, an op, its shape and a dtype; see where the op sits.

    ex = roofline_explorer()                     # matmul 4096 x 4096 x 4096, bf16, A100 80GB
    ex.result.bound.regime                       # "compute": 1365 FLOP/byte > ridge 153
    ex.set(op="softmax")                         # 0.625 FLOP/byte in bf16: memory-bound

The numbers come from gpulab.hardware (FLOPs and bytes of each op, the roofline); the picture
from gpulab.viz.plot_roofline.
Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab import hardware
from gpulab.explorers.base import Control, Explorer

# op -> how its (m, n, k) shape reads; k matters for the matmul only.
OPS = {
    "matmul": "C (m, n) = A (m, k) @ B (k, n)",
    "add": "y (m, n) = a (m, n) + b (m, n)",
    "layernorm": "LayerNorm over n, m rows",
    "softmax": "softmax over n, m rows",
}


def op_flops_bytes(op: str, m: int, n: int, k: int, dtype: str) -> tuple[int, int]:
    """(FLOPs, bytes moved) of `op` on an (m, n[, k]) shape, from gpulab.hardware's formulas."""
    if op == "matmul":
        return hardware.gemm_flops_bytes(m, n, k, dtype)
    if op == "add":  # one FLOP per element, two inputs and one output each read/written once
        flops = m * n
        return flops, round(flops / hardware.elementwise_intensity(2, 1, dtype))
    if op == "layernorm":
        return hardware.layernorm_flops_bytes(m, n, dtype)
    if op == "softmax":
        return hardware.softmax_flops_bytes(m, n, dtype)
    raise ValueError(f"unknown op {op!r}; choose one of {', '.join(OPS)}")


@dataclass(frozen=True)
class RooflinePoint:
    """One op of one shape in one dtype, placed on one GPU's roofline."""

    gpu: hardware.GPUSpec
    op: str  # a key of OPS
    shape: tuple[int, int, int]  # (m, n, k)
    dtype: str
    flops: int
    n_bytes: int
    bound: hardware.Bound  # regime, lower-bound time, intensity, ridge
    attainable_tflops: float  # the roof at this intensity


def roofline_point(gpu: str = "A100 80GB SXM", op: str = "matmul", m: int = 4096,
                   n: int = 4096, k: int = 4096, dtype: str = "bf16") -> RooflinePoint:
    """The pure function behind the explorer: FLOPs, bytes, regime and roof of one op.
    ValueError when the GPU has no throughput in that dtype (a T4 has no bf16)."""
    spec = hardware.get_gpu(gpu)
    flops, n_bytes = op_flops_bytes(op, m, n, k, dtype)
    b = hardware.bound(flops, n_bytes, spec, dtype)  # ValueError if the dtype is missing
    return RooflinePoint(spec, op, (m, n, k), hardware.dtype_key(dtype), flops, n_bytes, b,
                         hardware.attainable_tflops(spec, dtype, b.intensity))


def describe_point(p: RooflinePoint) -> str:
    m, n, k = p.shape
    shape = f"m={m}, n={n}" + (f", k={k}" if p.op == "matmul" else "")
    b = p.bound
    return "\n".join([
        f"{p.op} ({OPS[p.op]}), {shape}, {p.dtype} on {p.gpu.name}",
        f"  {p.flops:.4g} FLOP, {p.n_bytes:.4g} bytes moved: {b.intensity:.4g} FLOP/byte",
        f"  ridge point {b.ridge:.4g} FLOP/byte ({p.gpu.peak_tflops(p.dtype):g} TFLOP/s over "
        f"{p.gpu.bandwidth_gbps:g} GB/s): {b.regime}-bound",
        f"  at best {b.time_s * 1e6:.4g} us (compute {b.compute_s * 1e6:.4g} us, memory "
        f"{b.memory_s * 1e6:.4g} us), {p.attainable_tflops:.4g} TFLOP/s attainable",
    ])


def draw_point(p: RooflinePoint):
    from gpulab import viz

    intensity = p.bound.intensity
    lo, hi = min(0.1, intensity / 3), max(2000.0, intensity * 3)  # keep the op on the plot
    fig = viz.plot_roofline(p.gpu, p.dtype, ops=[(p.op, intensity, None)],
                            intensity_range=(lo, hi))
    fig.axes[0].scatter([intensity], [p.attainable_tflops], s=60, color="crimson", zorder=4)
    return fig


def roofline_explorer(interactive: bool | None = None, **values) -> Explorer:
    """GPU, op, shape (m, n, k) and dtype -> FLOP/byte, regime and best time on the roofline.
    values: start values of the controls (gpu, op, m, n, k, dtype)."""
    controls = [
        Control("gpu", "GPU", "A100 80GB SXM", tuple(hardware.list_gpus())),
        Control("op", "op", "matmul", tuple(OPS)),
        Control("m", "m", 4096, kind="number"),
        Control("n", "n", 4096, kind="number"),
        Control("k", "k (matmul only)", 4096, kind="number", used_when=("op", "matmul")),
        Control("dtype", "dtype", "bf16", hardware.DTYPES),
    ]
    return Explorer("Roofline explorer", controls, roofline_point, describe_point, draw_point,
                    values, interactive)
