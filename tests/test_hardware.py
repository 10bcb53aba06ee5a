"""The spec sheet and the performance model: datasheet numbers, lookups, roofline, waves."""

import math
import re

import numpy as np
import pytest
import torch

import gpulab  # noqa: F401  (decides the runner first)
from gpulab import hardware as hw
from gpulab.gpu_specs import DTYPES, GPUS, GPUSpec, get_gpu, list_gpus

TENSOR_DTYPES = ("tf32", "fp16", "bf16", "fp8", "int8")
REQUIRED_GPUS = ["T4", "L4", "A10G", "V100 SXM2 32GB", "A100 40GB SXM", "A100 80GB SXM",
                 "H100 SXM", "H100 PCIe", "H200", "RTX 3080", "RTX 3090", "RTX 4070 Ti",
                 "RTX 4090", "RTX A6000", "RTX 6000 Ada", "MI300X"]


# --- the spec sheet ----------------------------------------------------------------------------

def test_the_course_gpus_are_all_there():
    missing = set(REQUIRED_GPUS) - set(list_gpus())
    assert not missing, f"spec sheet lacks {missing}"
    assert len(set(list_gpus())) == len(GPUS), "two rows share a name"


@pytest.mark.parametrize("name, field, value", [
    ("A100 40GB SXM", "sms", 108), ("A100 40GB SXM", "fp32", 19.5),
    ("A100 40GB SXM", "tf32", 156), ("A100 40GB SXM", "fp16", 312),
    ("A100 40GB SXM", "bf16", 312), ("A100 40GB SXM", "bandwidth_gbps", 1555),
    ("A100 40GB SXM", "l2_mb", 40), ("A100 80GB SXM", "bandwidth_gbps", 2039),
    ("H100 SXM", "sms", 132), ("H100 SXM", "fp32", 67), ("H100 SXM", "tf32", 494.7),
    ("H100 SXM", "fp16", 989.4), ("H100 SXM", "fp8", 1978.9),
    ("H100 SXM", "bandwidth_gbps", 3350), ("H100 SXM", "l2_mb", 50),
    ("T4", "sms", 40), ("T4", "fp32", 8.1), ("T4", "fp16", 65), ("T4", "bandwidth_gbps", 320),
    ("T4", "l2_mb", 4), ("H200", "bandwidth_gbps", 4800), ("MI300X", "memory_gb", 192),
])
def test_datasheet_numbers(name, field, value):
    assert getattr(get_gpu(name), field) == pytest.approx(value)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_every_row_is_complete_and_consistent(gpu: GPUSpec):
    assert gpu.vendor in {"NVIDIA", "AMD"}
    assert gpu.segment in {"datacenter", "workstation", "consumer"}
    assert (gpu.compute_capability is None) == (gpu.vendor == "AMD")
    for field in ("sms", "memory_gb", "bandwidth_gbps", "l2_mb", "smem_per_sm_kb",
                  "registers_per_sm_kb", "fp32", "tdp_w"):
        assert getattr(gpu, field) > 0, f"{gpu.name}.{field} must be positive"
    assert gpu.smem_per_sm_kb <= gpu.l1_smem_per_sm_kb, "shared memory is carved out of L1"
    assert gpu.pcie_gen in (3, 4, 5)
    assert gpu.datasheet and gpu.architecture and gpu.memory_type
    assert gpu.interconnect_gbps is None or gpu.interconnect_gbps > 0
    assert gpu.tensor_cores, f"{gpu.name}: every GPU in the table has tensor (matrix) cores"
    # Tensor cores beat the plain fp32 rate, and narrower types run at least as fast as wider.
    rates = {d: getattr(gpu, d) for d in TENSOR_DTYPES if getattr(gpu, d) is not None}
    assert all(r >= gpu.fp32 for r in rates.values()), f"{gpu.name}: tensor rate below fp32"
    if gpu.bf16 is not None and gpu.fp16 is not None:
        assert gpu.bf16 == gpu.fp16
    # Dense tensor-core rates double with each halving of the width: a row copied from a
    # sparse column, or one mixing fp16- and fp32-accumulate figures, breaks these ratios.
    if gpu.tf32 is not None:
        assert gpu.fp16 == pytest.approx(2 * gpu.tf32, rel=0.02), gpu.name
    if gpu.fp8 is not None:
        assert gpu.fp8 == pytest.approx(2 * gpu.fp16, rel=0.02), gpu.name


@pytest.mark.parametrize("gpu", [g for g in GPUS if g.vendor == "NVIDIA"], ids=lambda g: g.name)
def test_dtype_support_follows_compute_capability(gpu: GPUSpec):
    cc = gpu.compute_capability
    assert (gpu.bf16 is not None) == (cc >= (8, 0)), "bf16 and tf32 tensor cores came in Ampere"
    assert (gpu.tf32 is not None) == (cc >= (8, 0))
    assert (gpu.fp8 is not None) == (cc >= (8, 9)), "fp8 tensor cores came in Ada and Hopper"
    assert gpu.registers_per_sm_kb == 256  # 65536 32-bit registers per SM since Kepler


def test_peak_tflops_reads_the_column_and_explains_a_missing_one():
    assert get_gpu("H100 SXM").peak_tflops(torch.bfloat16) == 989.4
    assert get_gpu("RTX 4090").peak_tflops("float8_e4m3fn") == 330.3
    with pytest.raises(ValueError, match=r"T4 has no bf16.*fp16"):
        get_gpu("T4").peak_tflops("bf16")


@pytest.mark.parametrize("dtype, key", [("bf16", "bf16"), ("bfloat16", "bf16"),
                                        (torch.float16, "fp16"), ("float32", "fp32"),
                                        (torch.int8, "int8"), ("TF32", "tf32")])
def test_dtype_key(dtype, key):
    assert hw.dtype_key(dtype) == key


def test_dtype_key_rejects_unknown():
    with pytest.raises(ValueError, match="fp32"):
        hw.dtype_key("float64")


# --- lookup ------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, name", [
    ("a100", "A100 40GB SXM"), ("A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("h100", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("Tesla T4", "T4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"), ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("rtx4070ti", "RTX 4070 Ti"),
    ("NVIDIA RTX A6000", "RTX A6000"), ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("AMD Instinct MI300X", "MI300X"), ("nvidia h200", "H200"),
])
def test_lookup_is_forgiving(query, name):
    assert get_gpu(query).name == name


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_every_name_and_alias_finds_its_own_row(gpu):
    for name in (gpu.name, *gpu.aliases, gpu.name.upper()):
        assert get_gpu(name) is gpu, name


@pytest.mark.parametrize("query", ["NVIDIA GeForce RTX 3090 Ti", "RTX 4070", "NVIDIA H100 NVL",
                                   "Tesla V100-SXM2-16GB", "NVIDIA L40S", "Quadro RTX 6000",
                                   "NVIDIA GeForce RTX 4090 Laptop GPU", "TPU v4"])
def test_lookup_refuses_other_cards(query):
    # A near miss must not silently borrow another card's numbers.
    with pytest.raises(KeyError, match="Known: T4, L4"):
        get_gpu(query)


def test_lookup_passes_specs_through():
    spec = get_gpu("L4")
    assert get_gpu(spec) is spec


# --- roofline ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, dtype, ridge", [("A100 80GB SXM", "bf16", 153.0),
                                                ("H100 SXM", "bf16", 295.3),
                                                ("T4", "fp16", 203.1), ("T4", "fp32", 25.3),
                                                ("H200", "fp8", 412.3)])
def test_ridge_points(name, dtype, ridge):
    assert hw.ops_per_byte(name, dtype) == pytest.approx(ridge, abs=0.1)


def test_attainable_follows_the_two_roofs():
    gpu = get_gpu("A100 80GB SXM")
    assert hw.attainable_tflops(gpu, "bf16", 10) == pytest.approx(20.39)  # 2039 GB/s x 10
    assert hw.attainable_tflops(gpu, "bf16", 1e4) == 312
    curve = hw.attainable_tflops(gpu, "bf16", np.logspace(-1, 4, 50))
    assert curve.shape == (50,) and np.all(np.diff(curve) >= 0)
    assert curve.max() == 312


def test_bound_of_an_elementwise_add_is_memory():
    n = 100_000_000
    b = hw.bound(n, 3 * n * 4, "A100 80GB SXM", "fp32")  # c = a + b in fp32
    assert b.regime == "memory"
    assert b.time_s == pytest.approx(1.2e9 / 2039e9)
    assert b.intensity == pytest.approx(1 / 12)
    assert b.compute_s < b.memory_s
    assert b.efficiency(2 * b.time_s) == pytest.approx(0.5)


def test_bound_of_a_big_matmul_is_compute():
    flops, n_bytes = hw.gemm_flops_bytes(8192, 8192, 8192, "bf16")
    b = hw.bound(flops, n_bytes, "H100 SXM", "bf16")
    assert b.regime == "compute"
    assert b.time_s == pytest.approx(2 * 8192**3 / 989.4e12)
    assert b.ridge == pytest.approx(hw.ops_per_byte("H100 SXM", "bf16"))


# --- intensity ---------------------------------------------------------------------------------

def test_elementwise_intensity():
    assert hw.elementwise_intensity(2, 1, "fp32") == pytest.approx(1 / 12)
    assert hw.elementwise_intensity(2, 1, "bf16") == pytest.approx(1 / 6)
    assert hw.elementwise_intensity(1, 1, "fp32", flops_per_element=4) == pytest.approx(0.5)


def test_gemm_counts():
    flops, n_bytes = hw.gemm_flops_bytes(128, 256, 64, "fp16")
    assert flops == 2 * 128 * 256 * 64
    assert n_bytes == (128 * 64 + 64 * 256 + 128 * 256) * 2
    assert hw.gemm_intensity(4096, 4096, 4096, "bf16") == pytest.approx(4096 / 3)
    small, big = hw.gemm_intensity(256, 256, 256), hw.gemm_intensity(2048, 2048, 2048)
    assert big == pytest.approx(8 * small), "square matmul intensity grows linearly with n"


def test_normalisation_intensities_are_low_and_size_free():
    assert hw.softmax_intensity(4096, 4096, "fp32") == pytest.approx(5 / 8)
    flops, n_bytes = hw.layernorm_flops_bytes(4, 1024, "fp32")
    assert flops == 8 * 4 * 1024 and n_bytes == (2 * 4 * 1024 + 2 * 1024) * 4
    assert hw.layernorm_intensity(65536, 4096, "fp32") == pytest.approx(1.0, rel=1e-3)
    for name in ("A100 80GB SXM", "T4", "RTX 4090"):
        assert hw.bound(*hw.softmax_flops_bytes(4096, 4096, "fp16"), name, "fp16").regime == \
            "memory"


# --- waves -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_blocks, blocks_per_sm, waves_ceil, tail, utilization", [
    (144, 1, 2, 36, 144 / 216),  # 108 SMs: one full wave, then 36 blocks and 72 idle slots
    (108, 1, 1, 108, 1.0),
    (109, 1, 2, 1, 109 / 216),  # one block too many doubles the time
    (1000, 2, 5, 136, 1000 / 1080),  # 216 slots: 4 full waves = 864, then 136
    (1, 4, 1, 1, 1 / 432),
])
def test_waves_worked_by_hand(n_blocks, blocks_per_sm, waves_ceil, tail, utilization):
    w = hw.waves(n_blocks, "A100 80GB SXM", blocks_per_sm)
    assert w.slots == 108 * blocks_per_sm
    assert w.waves == pytest.approx(n_blocks / w.slots)
    assert w.waves_ceil == waves_ceil
    assert w.tail_blocks == tail
    assert w.utilization == pytest.approx(utilization)


def test_waves_rejects_empty_grids():
    with pytest.raises(ValueError, match="n_blocks"):
        hw.waves(0, "T4")


def test_matmul_tile_quantization():
    assert hw.gemm_tiles(1536, 1536) == 144
    assert hw.gemm_tiles(1000, 1000) == 64  # 8 x 8 tiles, the edge ones partly empty
    assert hw.gemm_tiles(1000, 1000, 256, 128) == 4 * 8
    assert hw.tile_utilization(1000, 1000) == pytest.approx(1e6 / (64 * 128 * 128))
    assert hw.tile_utilization(1024, 2048) == 1.0
    w = hw.gemm_waves(1536, 1536, "A100 40GB SXM")
    assert (w.n_blocks, w.waves_ceil) == (144, 2) and w.utilization == pytest.approx(2 / 3)
    assert hw.gemm_waves(1536, 1536, "H100 SXM").waves_ceil == 2  # 144 tiles > 132 SMs too


# --- this machine ------------------------------------------------------------------------------

def test_measure_roofline_on_cpu():
    m = hw.measure_roofline("cpu", dtypes=("fp32", "bf16"), copy_mb=8, matmul_n=128)
    assert m.measured and m.device == "cpu" and "measured" in m.name
    assert m.bandwidth_gbps > 0 and m.fp32 > 0 and m.bf16 > 0
    assert hw.ops_per_byte(m, "fp32") == pytest.approx(m.fp32 * 1e3 / m.bandwidth_gbps)
    with pytest.raises(ValueError, match="tf32"):
        m.peak_tflops("tf32")


def test_measure_roofline_stops_growing_a_matmul_that_is_already_slow(monkeypatch):
    """bf16 on a CPU without bf16 instructions: 0.3 GFLOP/s, a minute for one n=2048 matmul.
    Once a size takes longer than the budget, the larger ones are not run."""
    import gpulab.timing

    real, sizes = gpulab.timing.benchmark, []

    def slow_bf16(fn, *args, **kwargs):
        if fn is torch.matmul:
            a = args[0]
            sizes.append((str(a.dtype), a.shape[0]))
            if a.dtype == torch.bfloat16:  # 0.3 GFLOP/s, as measured on such a CPU
                t = 2 * a.shape[0] ** 3 / 0.3e9
                return gpulab.timing.Timing(median_s=t, min_s=t, max_s=t, repeat=1, device="cpu")
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(gpulab.timing, "benchmark", slow_bf16)
    m = hw.measure_roofline("cpu", dtypes=("fp32", "bf16"), copy_mb=4, matmul_n=2048)
    assert [n for dtype, n in sizes if dtype == "torch.bfloat16"] == [256, 512]  # 0.11 s, 0.9 s
    assert m.bf16 == pytest.approx(0.3e-3)
    assert [n for dtype, n in sizes if dtype == "torch.float32"][0] == 256  # smallest first


def test_measure_roofline_rejects_dtypes_it_cannot_measure():
    with pytest.raises(ValueError, match="fp32 and bf16"):
        hw.measure_roofline("cpu", dtypes=("fp8",), copy_mb=1, matmul_n=8)


def test_this_machine_finds_the_gpu_by_its_torch_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    assert hw.this_machine("cuda") is get_gpu("A100 80GB SXM")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA B200")
    assert hw.this_machine("cuda") is None


def test_this_machine_on_cpu_is_measured(monkeypatch):
    fast = hw.measure_roofline
    monkeypatch.setattr(hw, "measure_roofline",
                        lambda device: fast(device, copy_mb=4, matmul_n=64))
    m = hw.this_machine("cpu")
    assert isinstance(m, hw.MeasuredRoofline) and m.device == "cpu"
    assert math.isfinite(m.peak_tflops("fp32"))


def test_every_dtype_column_is_a_spec_field():
    assert set(DTYPES) <= set(GPUSpec.__dataclass_fields__)
    assert all(re.fullmatch(r"[a-z0-9]+", d) for d in DTYPES)


def test_time_ops_keeps_every_op_under_the_roofs_measured_with_it():
    """An elementwise add and matmuls timed with the ceilings, round after round: each op's
    efficiency is at most 100% of its own bound, and the largest matmul sets the flat roof."""
    n = 1 << 20
    a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
    ops = {"a + b": (lambda: torch.add(a, b, out=out), n, 3 * a.nbytes)}
    for size in (32, 256):
        x = torch.randn(size, size)
        ops[f"matmul {size}"] = (lambda x=x: x @ x, *hw.gemm_flops_bytes(size, size, size, "fp32"))
    timed, roof = hw.time_ops(ops, dtype="fp32", rounds=2, copy_mb=8)
    assert [op.label for op in timed] == list(ops)
    assert roof.measured and roof.bf16 is None and roof.fp32 == max(op.tflops for op in timed)
    for op in timed:
        assert hw.bound(op.flops, op.n_bytes, roof, "fp32").efficiency(op.time_s) <= 1 + 1e-9
    assert roof.bandwidth_gbps >= timed[0].gbps
    with pytest.raises(ValueError, match="fp8"):
        hw.time_ops(ops, dtype="fp8")
