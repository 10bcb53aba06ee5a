"""Floating-point formats for training, and why fp16 needs loss scaling.

dtype_table()          bits, exponent/mantissa bits, range and precision of fp32, tf32, fp16,
                       bf16 and the two fp8 formats, read from torch.finfo where torch has the dtype
format_dtype_table()   the same as a text table for a notebook
demo_fp16_underflow()  small gradients cast to fp16 become zero; a GradScaler-style scale factor
                       keeps them; too large a factor overflows to inf (why the scale backs off)
cpu_bf16()             whether this CPU has bf16 instructions, or PyTorch emulates bf16 on it
                       (then a bf16 timing here is slower than fp32 and says nothing of a GPU)

Everything here runs on a CPU: the demonstration casts gradient *values* to fp16 and never runs an
fp16 matmul (those are emulated on CPUs and hundreds of times slower than bf16).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DtypeFacts:
    """What one floating-point format can represent."""

    name: str  # the course's short name: "fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"
    bits: int  # storage width (tf32 is stored as fp32; 19 bits take part in the math)
    exponent_bits: int  # sets the range
    mantissa_bits: int  # explicit fraction bits: sets the precision
    max: float  # largest finite value
    smallest_normal: float  # below this, values lose precision (subnormals), then become 0
    smallest_subnormal: float  # anything smaller in magnitude rounds to zero
    eps: float  # machine epsilon: the gap between 1.0 and the next representable number
    source: str  # "torch.finfo(torch.float16)" or why the numbers are stated by hand


# name -> (torch dtype attribute, exponent bits, mantissa bits)
_FORMATS = {
    "fp32": ("float32", 8, 23),
    "tf32": (None, 8, 10),  # a tensor-core math mode, not a tensor dtype
    "fp16": ("float16", 5, 10),
    "bf16": ("bfloat16", 8, 7),
    "fp8_e4m3": ("float8_e4m3fn", 4, 3),
    "fp8_e5m2": ("float8_e5m2", 5, 2),
}


def _stated(name: str, exponent_bits: int, mantissa_bits: int) -> DtypeFacts:
    """The facts from the bit layout, for formats torch has no dtype (or finfo) for."""
    bias = 2 ** (exponent_bits - 1) - 1
    if name == "fp8_e4m3":
        # e4m3 "fn" gives up inf and keeps one NaN pattern, so its top exponent holds numbers:
        # max = 1.75 * 2**8 = 448 (an IEEE-style e4m3 would stop at 240).
        top = 1.75 * 2.0**8
        note = "stated: OCP fp8 e4m3fn (no inf), torch has no float8_e4m3fn here"
    else:
        top = (2 - 2.0**-mantissa_bits) * 2.0**bias  # IEEE: the all-ones exponent is inf/NaN
        note = ("stated: tf32 is a tensor-core mode for fp32 matmuls (fp32 range, 10-bit "
                "mantissa), torch has no tf32 dtype" if name == "tf32"
                else f"stated: IEEE-style layout, torch has no dtype for {name} here")
    bits = 1 + exponent_bits + mantissa_bits
    normal = 2.0 ** (1 - bias)
    return DtypeFacts(name, 32 if name == "tf32" else bits, exponent_bits, mantissa_bits,
                      top, normal, normal * 2.0**-mantissa_bits, 2.0**-mantissa_bits, note)


def dtype_facts(name: str) -> DtypeFacts:
    """The facts for one format: "fp32", "tf32", "fp16", "bf16", "fp8_e4m3" or "fp8_e5m2"."""
    if name not in _FORMATS:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(_FORMATS)}")
    attr, exponent_bits, mantissa_bits = _FORMATS[name]
    dtype = getattr(torch, attr, None) if attr else None
    if dtype is None:
        return _stated(name, exponent_bits, mantissa_bits)
    info = torch.finfo(dtype)
    # finfo has no "smallest subnormal": it is the smallest normal times eps, because subnormals
    # keep the smallest exponent and spend the mantissa bits one by one.
    mantissa = round(-math.log2(info.eps))
    return DtypeFacts(name, info.bits, info.bits - 1 - mantissa, mantissa, float(info.max),
                      float(info.smallest_normal), float(info.smallest_normal * info.eps),
                      float(info.eps), f"torch.finfo(torch.{attr})")


def dtype_table() -> list[DtypeFacts]:
    """All six formats, widest first."""
    return [dtype_facts(name) for name in _FORMATS]


def format_dtype_table(rows: list[DtypeFacts] | None = None) -> str:
    """A fixed-width text table of `rows` (default: dtype_table())."""
    rows = dtype_table() if rows is None else rows
    header = f"{'format':<9} {'bits':>4} {'exp':>3} {'man':>3} {'max':>10} " \
             f"{'min normal':>10} {'min subnorm':>11} {'eps':>9}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.name:<9} {r.bits:>4} {r.exponent_bits:>3} {r.mantissa_bits:>3} "
                     f"{r.max:>10.3g} {r.smallest_normal:>10.3g} {r.smallest_subnormal:>11.3g} "
                     f"{r.eps:>9.3g}")
    return "\n".join(lines)


@dataclass(frozen=True)
class UnderflowDemo:
    """Where gradient values end up when stored in fp16, with and without loss scaling."""

    n: int  # how many gradient values
    zero_fp16: float  # fraction of nonzero fp32 values that became 0 in fp16
    zero_bf16: float  # the same in bf16 (fp32's exponent range: expected 0)
    zero_scaled: float  # in fp16 after multiplying by `scale` (as GradScaler scales the loss)
    inf_scaled: float  # fraction that overflowed to inf at `scale` (expected 0 after back-off)
    scale: float  # the factor used: the largest power of two <= init_scale with no inf
    inf_at_init_scale: float  # fraction that overflowed at init_scale, before backing off
    init_scale: float
    subnormal_scaled: float  # fraction kept only as fp16 subnormals (fewer mantissa bits)
    median_rel_error_scaled: float  # median |unscaled fp16 - fp32| / |fp32| over the kept values

    def summary(self) -> str:
        return (f"{self.n} gradient values: {self.zero_fp16:.1%} become 0 in fp16, "
                f"{self.zero_bf16:.1%} in bf16; with loss scale {self.scale:g} only "
                f"{self.zero_scaled:.1%} do (median relative error "
                f"{self.median_rel_error_scaled:.2g}, {self.subnormal_scaled:.1%} subnormal). "
                f"At scale {self.init_scale:g}, {self.inf_at_init_scale:.1%} overflowed to inf, "
                "so the scale was halved until none did, as GradScaler does.")


def log_uniform_gradients(n: int = 10_000, low: float = 1e-10, high: float = 1e1,
                          seed: int = 0) -> torch.Tensor:
    """`n` fp32 values with magnitudes spread evenly in log scale over [low, high], random signs:
    late-training gradients span many orders of magnitude, most of them tiny."""
    g = torch.Generator().manual_seed(seed)
    exponents = torch.empty(n).uniform_(math.log10(low), math.log10(high), generator=g)
    signs = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    return (10.0**exponents * signs).float()


def demo_fp16_underflow(grads: torch.Tensor | None = None, init_scale: float = 2.0**16,
                        seed: int = 0) -> UnderflowDemo:
    """Cast fp32 gradient values to fp16 with and without a loss scale, and count the losses.

    `grads` defaults to log_uniform_gradients(seed=seed); pass real ones (`p.grad` of a model) to
    see the same on your own model. init_scale defaults to GradScaler's. Scaling the loss by S
    scales every gradient by S (the chain rule is linear), so fp16 stores g*S and the optimizer
    later divides by S in fp32.
    """
    grads = log_uniform_gradients(seed=seed) if grads is None else grads.detach().float().cpu()
    nonzero = grads[grads != 0].flatten()
    if nonzero.numel() == 0:
        raise ValueError("all gradient values are 0: nothing can underflow")

    def zero_fraction(stored: torch.Tensor) -> float:
        return (stored == 0).float().mean().item()

    def inf_fraction(scale: float) -> float:
        return torch.isinf((nonzero * scale).half()).float().mean().item()

    # GradScaler starts high and halves the scale after every step that produced inf/NaN.
    scale = init_scale
    while scale > 1 and inf_fraction(scale) > 0:
        scale /= 2
    scaled = (nonzero * scale).half()
    unscaled = scaled.float() / scale  # GradScaler.unscale_ divides in fp32
    kept = scaled != 0
    rel = ((unscaled[kept] - nonzero[kept]).abs() / nonzero[kept].abs()).median().item()
    smallest_normal = torch.finfo(torch.float16).smallest_normal
    return UnderflowDemo(
        n=nonzero.numel(),
        zero_fp16=zero_fraction(nonzero.half()),
        zero_bf16=zero_fraction(nonzero.bfloat16()),
        zero_scaled=zero_fraction(scaled),
        inf_scaled=inf_fraction(scale),
        scale=scale,
        inf_at_init_scale=inf_fraction(init_scale),
        init_scale=init_scale,
        subnormal_scaled=(kept & (scaled.abs() < smallest_normal)).float().mean().item(),
        median_rel_error_scaled=rel,
    )


# CPU flags of bf16 instructions: x86's AVX512-BF16 and AMX-BF16, Arm's BF16 (as Linux names them).
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")


@dataclass(frozen=True)
class CpuBf16:
    """Whether this CPU computes bf16 with its own instructions, and the flags that say so."""

    native: bool | None  # False: PyTorch emulates bf16 through fp32; None: the flags are unknown
    flags: tuple[str, ...]  # the bf16 flags the CPU reports (empty when none)

    def summary(self) -> str:
        if self.native:
            return f"this CPU has bf16 instructions ({', '.join(self.flags)})"
        if self.native is False:
            return ("this CPU has no bf16 instructions (no amx_bf16, avx512_bf16 or bf16 flag): "
                    "PyTorch emulates bf16 on it, so its bf16 timings are EMULATED")
        return "this CPU's flags cannot be read here: its bf16 may be native or emulated"


def cpu_bf16(cpuinfo: str | None = None) -> CpuBf16:
    """Read the CPU's flags from /proc/cpuinfo (Linux; pass its text instead to test). Where there
    is no such file (macOS, Windows), `native` is None: unknown, not absent."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return CpuBf16(None, ())
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 says flags, Arm says Features
            flags.update(value.split())
    found = tuple(f for f in NATIVE_BF16_FLAGS if f in flags)
    return CpuBf16(bool(found), found)
