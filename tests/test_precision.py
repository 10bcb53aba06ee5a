"""gpulab.precision: the dtype table agrees with torch and with the formats' own arithmetic, and
the fp16 underflow demonstration shows what loss scaling is for."""

import pytest
import torch

from gpulab import precision

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def torch_dtype(name):
    dtype = getattr(torch, TORCH_DTYPES[name], None)
    if dtype is None:
        pytest.skip(f"this torch has no {TORCH_DTYPES[name]}")
    return dtype


def test_table_lists_the_six_formats_in_order():
    names = [row.name for row in precision.dtype_table()]
    assert names == ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
    text = precision.format_dtype_table()
    assert all(name in text for name in names)


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_rows_come_from_torch_finfo(name):
    info = torch.finfo(torch_dtype(name))
    row = precision.dtype_facts(name)
    assert row.source.startswith("torch.finfo")
    assert (row.bits, row.max, row.smallest_normal, row.eps) == (
        info.bits, info.max, info.smallest_normal, info.eps)
    assert 1 + row.exponent_bits + row.mantissa_bits == row.bits


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_the_bit_layout_formula_reproduces_torch(name):
    """The formula that states tf32's numbers gives torch's numbers for every real dtype."""
    torch_dtype(name)
    row = precision.dtype_facts(name)
    stated = precision._stated(name, row.exponent_bits, row.mantissa_bits)
    assert (stated.max, stated.smallest_normal, stated.smallest_subnormal, stated.eps) == (
        row.max, row.smallest_normal, row.smallest_subnormal, row.eps)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_eps_and_smallest_subnormal_behave_as_defined(name):
    dtype, row = torch_dtype(name), precision.dtype_facts(name)
    one = torch.ones((), dtype=dtype)
    assert one + row.eps != one, "1 + eps must be the next number after 1"
    assert one + row.eps / 2 == one, "half of eps is lost when added to 1 (round to even)"
    tiny = torch.tensor(row.smallest_subnormal, dtype=torch.float64)
    assert tiny.to(dtype).item() == row.smallest_subnormal
    assert (tiny * 0.49).to(dtype).item() == 0.0, "below half the smallest subnormal rounds to 0"


def test_facts_a_course_relies_on():
    fp32, tf32, fp16, bf16, e4m3, e5m2 = precision.dtype_table()
    assert fp16.max == 65504.0  # why fp16 overflows where fp32 and bf16 do not
    assert bf16.exponent_bits == fp32.exponent_bits and bf16.smallest_normal == fp32.smallest_normal
    assert tf32.mantissa_bits == fp16.mantissa_bits and tf32.exponent_bits == fp32.exponent_bits
    assert tf32.source.startswith("stated")
    assert (e4m3.max, e5m2.max) == (448.0, 57344.0)  # e4m3fn trades inf for range


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="fp16"):
        precision.dtype_facts("fp12")


def test_fp16_underflow_and_loss_scaling():
    demo = precision.demo_fp16_underflow()
    assert demo.zero_fp16 > 0.1, "tiny gradients should vanish in fp16"
    assert demo.zero_bf16 == 0.0, "bf16 has fp32's exponent range"
    assert demo.zero_scaled < demo.zero_fp16 / 10
    assert demo.inf_at_init_scale > 0 and demo.inf_scaled == 0.0
    assert demo.scale < demo.init_scale and demo.scale.is_integer()
    assert demo.scale == 2.0 ** round(torch.log2(torch.tensor(demo.scale)).item())
    assert demo.median_rel_error_scaled < 1e-3  # fp16 keeps ~3 decimal digits of a normal value
    assert "fp16" in demo.summary()


def test_underflow_demo_on_given_gradients():
    grads = torch.full((100,), 1e-9)  # all below fp16's smallest subnormal (6e-8)
    demo = precision.demo_fp16_underflow(grads)
    assert demo.zero_fp16 == 1.0 and demo.zero_scaled == 0.0
    assert demo.scale == demo.init_scale  # nothing overflows: no back-off
    with pytest.raises(ValueError, match="0"):
        precision.demo_fp16_underflow(torch.zeros(10))


def test_cpu_bf16_reads_the_flags_of_x86_and_arm():
    x86_without = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n"
    x86_with = "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n"
    arm_with = "Features\t: fp asimd bf16 i8mm\n"
    assert precision.cpu_bf16(x86_without) == precision.CpuBf16(False, ())
    assert precision.cpu_bf16(x86_with) == precision.CpuBf16(True, ("amx_bf16", "avx512_bf16"))
    assert precision.cpu_bf16(arm_with).native is True
    assert "EMULATED" in precision.cpu_bf16(x86_without).summary()
    assert "amx_bf16" in precision.cpu_bf16(x86_with).summary()
    assert "cannot be read" in precision.CpuBf16(None, ()).summary()
    assert precision.cpu_bf16().native in (True, False, None)  # this machine, whatever it is
