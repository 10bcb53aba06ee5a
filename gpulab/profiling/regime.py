"""Which of the three limits sets a step's pace: compute, memory bandwidth, or overhead.

Every op the step runs gets a roofline time from its FLOPs and estimated bytes,
max(FLOPs / peak FLOP/s, bytes / bandwidth): the "speed of light" of lessons/01. Then:

    overhead-bound  the device sat idle most of the step (busy_fraction < BUSY_MIN: waiting for
                    data, Python, synchronisation), or dispatching the ops costs more than the
                    work in them (ops x op_overhead_s > roofline time: many tiny ops), or the
                    ops ran far below the roofline (speed of light < SOL_MIN: per-op costs the
                    counts do not see, such as thread start-up or half-empty vector units)
    compute-bound   otherwise, if the ops limited by FLOP/s hold most of the roofline time
    memory-bound    otherwise: the ops limited by bandwidth hold most of it

On a CPU the "device" is the CPU itself and the roofline is measured here
(gpulab.hardware.measure_roofline), not read from a spec sheet.

    result.regime()          # Regime(regime="overhead", reason="...", ...)
    print(result.regime())   # overhead-bound: 2000 ops per step at about 2 us of dispatch ...

Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from dataclasses import dataclass

from gpulab import hardware
from gpulab.hardware import LAUNCH_OVERHEAD_S
from gpulab.timing import format_seconds

# The fixed host cost of one op: Python, PyTorch's dispatcher and, on a GPU, the kernel launch.
# Eager PyTorch runs about 100k-300k tiny ops a second on a CPU (about 1.6 us each on the
# course's CI machine) and issues CUDA kernels at a few microseconds each.
OP_OVERHEAD_S = {"cuda": LAUNCH_OVERHEAD_S, "cpu": 2e-6}
BUSY_MIN = 0.5  # below this busy fraction the device mostly waits: overhead-bound
SOL_MIN = 0.05  # below this fraction of the roofline the ops' math and traffic explain little


@dataclass(frozen=True)
class Regime:
    """What limits a profiled step, per step and at the roofline, with the reasoning."""

    regime: str  # "compute", "memory" or "overhead"
    reason: str  # the argument, in words
    device: str  # "cuda" or "cpu"
    roofline: str  # the roofline's name ("H100 SXM", "this CPU (measured)")
    dtype: str  # roofline column of most of the FLOPs ("fp32", "bf16", ...)
    ridge: float  # that column's ridge point, FLOP per byte
    intensity: float  # the step's FLOPs over its estimated bytes, FLOP per byte
    flops: float  # FLOPs per step (the ops the profiler counts: matmuls, convs, mul, add)
    n_bytes: float  # bytes per step, estimated from the ops' shapes (profiling.traffic)
    compute_s: float  # roofline time of the ops limited by FLOP/s, per step
    memory_s: float  # roofline time of the ops limited by bandwidth, per step
    overhead_s: float  # ops_per_step x the per-op overhead: their fixed cost, per step
    ops_per_step: float  # ops dispatched from Python per step (aten ops, not the ones inside)
    busy_fraction: float  # of the step, the device was working (ProfileResult.busy_fraction)
    step_s: float  # measured wall time of a step

    @property
    def speed_of_light(self) -> float:
        """Roofline time over measured time: 1 means the ops ran as fast as the machine can."""
        return (self.compute_s + self.memory_s) / self.step_s

    def __str__(self) -> str:
        return textwrap.fill(f"{self.regime}-bound: {self.reason}", width=100)


def default_roofline(result):
    """This machine's roofline for `result`: a CUDA GPU's spec-sheet row (measured when the
    table lacks it), or ceilings measured on this CPU, in the dtypes the step computes in."""
    dtypes = {op.dtype for op in result.ops if op.outermost and op.work_flops} & {"fp32", "bf16"}
    dtypes = tuple(sorted(dtypes | {"fp32"}))
    if result.device == "cuda":
        spec = hardware.this_machine("cuda")
        return spec if spec is not None else hardware.measure_roofline("cuda", dtypes=dtypes)
    if result.device == "cpu":
        return hardware.measure_roofline("cpu", dtypes=dtypes)
    raise ValueError(f"no default roofline for {result.device!r}: pass regime(roofline=...), "
                     "a GPUSpec or a MeasuredRoofline")


def _peak_tflops(roof, dtype: str) -> tuple[float, str]:
    """(peak, the column used): fp32's peak when the roofline has no figure for `dtype`."""
    try:
        return roof.peak_tflops(dtype), dtype
    except ValueError:
        return roof.peak_tflops("fp32"), "fp32"


def classify(result, roofline, op_overhead_s: float | None = None) -> Regime:
    """The Regime of a ProfileResult against `roofline` (a GPUSpec, a MeasuredRoofline or a
    spec-sheet name). op_overhead_s: fixed cost per op, default OP_OVERHEAD_S[device]."""
    roof = hardware.get_gpu(roofline) if isinstance(roofline, str) else roofline
    overhead_per_op = OP_OVERHEAD_S.get(result.device, OP_OVERHEAD_S["cpu"])
    if op_overhead_s is not None:
        overhead_per_op = op_overhead_s
    n_steps = len(result.steps)
    work = [op for op in result.ops_in_steps() if op.outermost]
    flops_by_dtype = defaultdict(float)
    compute_s = memory_s = 0.0
    for op in work:
        peak, column = _peak_tflops(roof, op.dtype)
        if op.work_flops:
            flops_by_dtype[column] += op.work_flops
        op_compute = op.work_flops / (peak * 1e12)
        op_memory = op.work_bytes / (roof.bandwidth_gbps * 1e9)
        if op_compute >= op_memory:  # each op is held back by one roof or the other
            compute_s += op_compute
        else:
            memory_s += op_memory
    dtype = max(flops_by_dtype, key=flops_by_dtype.get) if flops_by_dtype else "fp32"
    flops = sum(op.work_flops for op in work) / n_steps
    n_bytes = sum(op.work_bytes for op in work) / n_steps
    phases = result.phases()
    figures = dict(
        device=result.device, roofline=roof.name, dtype=dtype,
        ridge=hardware.ops_per_byte(roof, _peak_tflops(roof, dtype)[1]),
        intensity=flops / n_bytes if n_bytes else 0.0, flops=flops, n_bytes=n_bytes,
        compute_s=compute_s / n_steps, memory_s=memory_s / n_steps,
        overhead_s=len(work) * overhead_per_op / n_steps, ops_per_step=len(work) / n_steps,
        busy_fraction=result.busy_fraction(), step_s=phases.step_s)
    regime, reason = _decide(figures, phases, overhead_per_op, roof)
    return Regime(regime=regime, reason=reason, **figures)


def _decide(f: dict, phases, overhead_per_op: float, roof) -> tuple[str, str]:
    work_s = f["compute_s"] + f["memory_s"]
    at_roofline = (f"At the roofline of {roof.name} ({_peak_text(roof, f['dtype'])}, "
                   f"{roof.bandwidth_gbps:.4g} GB/s) the ops need {format_seconds(work_s)} per "
                   f"step; the step took {format_seconds(f['step_s'])}.")
    where = "the CPU" if f["device"] == "cpu" else "the GPU"
    if f["busy_fraction"] < BUSY_MIN:
        shares = phases.shares()
        if phases.largest() == "data":
            waiting = (f"for the next batch: data loading takes {shares['data']:.0%} of the step. "
                       "Prepare batches in DataLoader workers (num_workers, pin_memory), or do "
                       "per-sample work once, ahead of time")
        else:
            waiting = ("on Python, the framework and synchronisation. Give it more work per "
                       "launch (bigger batches, fused ops, torch.compile, CUDA graphs) and "
                       "remove host-device syncs (.item(), printing tensors)")
        regime, reason = "overhead", (
            f"{where} was busy only {f['busy_fraction']:.0%} of the step; the rest it waited "
            f"{waiting}. Faster kernels would not help.")
    elif f["overhead_s"] > work_s:
        regime, reason = "overhead", (
            f"{f['ops_per_step']:.0f} ops per step at about {overhead_per_op * 1e6:.3g} us of "
            f"dispatch each cost {format_seconds(f['overhead_s'])}, more than the "
            f"{format_seconds(work_s)} their FLOPs and bytes need: the fixed cost per op sets "
            "the pace, not arithmetic or memory. Fewer, bigger ops help: batch the work, fuse "
            "elementwise chains (torch.compile), avoid Python loops over small tensors.")
    elif work_s < SOL_MIN * f["step_s"]:
        regime, reason = "overhead", (
            f"the step ran at {work_s / f['step_s']:.1%} of the roofline's speed: its FLOPs and "
            "bytes explain little of its time. Costs that the counts do not see set the pace: "
            "fixed costs per op (thread start-up, launches), ops too small to fill the "
            "machine, and on a shared machine other programs. Bigger batches and fused ops "
            "(torch.compile) help more than cheaper arithmetic would.")
    else:
        side = "above" if f["intensity"] >= f["ridge"] else "below"
        regime = "compute" if f["compute_s"] >= f["memory_s"] else "memory"
        advice = {
            "compute": "Cheaper arithmetic helps: lower precision (bf16, TF32 on tensor cores), "
                       "fewer FLOPs.",
            "memory": "Moving fewer bytes helps: fuse elementwise ops (torch.compile), store "
                      "activations in bf16, avoid materializing intermediates.",
        }[regime]
        agrees = (side == "above") == (regime == "compute")
        heavy = "FLOP-heavy" if regime == "compute" else "byte-heavy"
        reason = (f"at the roofline, the ops limited by FLOP/s need "
                  f"{format_seconds(f['compute_s'])} per step and the ops limited by bandwidth "
                  f"{format_seconds(f['memory_s'])}. The step as a whole does "
                  f"{f['intensity']:.3g} FLOP per byte moved, {side} the ridge point of "
                  f"{f['ridge']:.3g} FLOP/byte ({f['dtype']})"
                  + ("" if agrees else f", yet most of the time is in its {heavy} ops")
                  + f". {advice}")
    reason += " " + at_roofline
    if f["device"] == "cpu":
        reason += (" On a CPU the device is the CPU itself: compute-bound means its vector "
                   "units set the pace, memory-bound its DRAM bandwidth, overhead-bound Python "
                   "and PyTorch's per-op dispatch (which on a GPU would leave the GPU idle).")
        if getattr(roof, "measured", False):
            reason += (" The roofline was measured on this machine (a large copy and a large "
                       "matmul), not read from a spec sheet.")
    return regime, reason


def _peak_text(roof, dtype: str) -> str:
    peak, column = _peak_tflops(roof, dtype)
    return f"{peak:.4g} TFLOP/s {column}"
