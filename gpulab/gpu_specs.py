"""A spec sheet for the GPUs learners meet, from laptops' big brothers to the data center.

Every throughput figure is DENSE: no 2:4 structured sparsity. Datasheets often headline the
sparse figure, which is exactly twice the dense one and which ordinary training never reaches.
fp16/bf16/tf32/fp8 are tensor-core rates with fp32 accumulation (what PyTorch uses). GeForce
cards (and the A10G) run fp32-accumulate tensor math at half their fp16-accumulate rate, so
their figures are half of what a gaming spec page may show. fp32 is the plain fp32 rate of the
CUDA cores (AMD: vector ALUs), without tensor cores.

    get_gpu("A100-SXM4-80GB").bandwidth_gbps    # 2039.0
    get_gpu("h100").peak_tflops("bf16")         # 989.4
    list_gpus()                                 # every name in the table

Units: GB = 1e9 bytes, GB/s = 1e9 bytes/s, TFLOP/s = 1e12 FLOP/s, MB and KB are 2**20 and 2**10
bytes (caches are sized in binary units). Each row names the document its numbers come from.
Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
# A PCIe x16 link, each direction, GB/s (after line encoding): the host link, and the only link
# between GPUs that have no NVLink. Both directions together are twice this.
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model's datasheet numbers (dense throughput, see the module docstring)."""

    name: str  # what this table calls it, e.g. "H100 SXM"
    vendor: str  # "NVIDIA" or "AMD"
    architecture: str  # "Hopper", "Ampere", ..., "CDNA 3"
    compute_capability: tuple[int, int] | None  # (major, minor) as torch reports it; None on AMD
    segment: str  # "datacenter", "workstation" or "consumer"
    sms: int  # streaming multiprocessors (AMD: compute units)
    memory_gb: float  # device memory (HBM or GDDR), GB
    memory_type: str  # "HBM3", "GDDR6X", ...
    bandwidth_gbps: float  # peak device-memory bandwidth, GB/s
    l2_mb: float  # last-level cache on the GPU die(s), MB
    smem_per_sm_kb: int  # most shared memory one SM can give its blocks, KB (AMD: LDS per CU)
    l1_smem_per_sm_kb: int  # L1 and shared memory per SM, KB (one SRAM on NVIDIA, two on AMD)
    registers_per_sm_kb: int  # register file per SM, KB (65536 32-bit registers on NVIDIA)
    fp32: float  # TFLOP/s on CUDA cores / vector ALUs, no tensor cores
    tf32: float | None  # TFLOP/s, tensor cores; None where unsupported
    fp16: float | None  # TFLOP/s, tensor cores, fp32 accumulate
    bf16: float | None  # TFLOP/s, tensor cores, fp32 accumulate
    fp8: float | None  # TFLOP/s, tensor cores
    int8: float | None  # TOPS, tensor cores
    tensor_cores: int | None  # tensor cores (AMD: matrix cores); None without any
    interconnect_gbps: float | None  # GPU-to-GPU link (NVLink, Infinity Fabric), both ways, GB/s
    pcie_gen: int  # PCIe generation of the x16 host link
    tdp_w: int  # board power limit, W
    datasheet: str  # the document the numbers come from
    aliases: tuple[str, ...] = ()  # other names to look it up by, e.g. torch's device name
    # L2 read bandwidth, GB/s, where NVIDIA publishes it (bytes per clock x the boost clock);
    # None elsewhere, and gpulab.sim.cost uses a stated ratio to the DRAM bandwidth instead.
    l2_gbps: float | None = None

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak TFLOP/s (int8: TOPS) for `dtype`; ValueError when the GPU lacks it."""
        key = dtype_key(dtype)
        value = getattr(self, key)
        if value is None:
            have = ", ".join(d for d in DTYPES if getattr(self, d) is not None)
            raise ValueError(f"{self.name} has no {key} throughput (no hardware support); "
                             f"it has: {have}.")
        return value


_DTYPE_NAMES = {"float32": "fp32", "float": "fp32", "tensorfloat32": "tf32",
                "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8"}


def dtype_key(dtype) -> str:
    """The spec sheet's column for a dtype: "bf16", "bfloat16" and torch.bfloat16 give "bf16"."""
    text = str(dtype).removeprefix("torch.").lower()
    key = text if text in DTYPES else _DTYPE_NAMES.get(text)
    if key is None:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    return key


_GB102_WP = "NVIDIA Ampere GA102 GPU architecture whitepaper"
_ADA_WP = "NVIDIA Ada GPU architecture whitepaper"
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet"
# L2 read bandwidth per clock, from the NVIDIA A100 Tensor Core GPU Architecture whitepaper
# ("2.3x the L2 cache read bandwidth of V100"): 5120 B/clk on A100, 2048 B/clk on V100, times
# each one's boost clock (1410 and 1530 MHz). NVIDIA publishes no such figure for the others.
_A100_L2_GBPS = 5120 * 1.410
_V100_L2_GBPS = 2048 * 1.530

GPUS: tuple[GPUSpec, ...] = (
    # NVIDIA T4 Tensor Core GPU datasheet (fp16 "mixed precision" 65 TFLOPS, int8 130 TOPS).
    GPUSpec("T4", "NVIDIA", "Turing", (7, 5), "datacenter", sms=40, memory_gb=16,
            memory_type="GDDR6", bandwidth_gbps=320, l2_mb=4, smem_per_sm_kb=64,
            l1_smem_per_sm_kb=96, registers_per_sm_kb=256, fp32=8.1, tf32=None, fp16=65,
            bf16=None, fp8=None, int8=130, tensor_cores=320, interconnect_gbps=None, pcie_gen=3,
            tdp_w=70, datasheet="NVIDIA T4 Tensor Core GPU datasheet", aliases=("Tesla T4",)),
    # NVIDIA L4 Tensor Core GPU datasheet (halves of its sparse figures: 120 TF32, 242 FP16,
    # 485 FP8); 58 SMs x 4 tensor cores.
    GPUSpec("L4", "NVIDIA", "Ada Lovelace", (8, 9), "datacenter", sms=58, memory_gb=24,
            memory_type="GDDR6", bandwidth_gbps=300, l2_mb=48, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=30.3, tf32=60, fp16=121,
            bf16=121, fp8=242.5, int8=242.5, tensor_cores=232, interconnect_gbps=None,
            pcie_gen=4, tdp_w=72, datasheet="NVIDIA L4 Tensor Core GPU datasheet"),
    # NVIDIA A10 Tensor Core GPU datasheet (dense; sparse doubles).
    GPUSpec("A10", "NVIDIA", "Ampere", (8, 6), "datacenter", sms=72, memory_gb=24,
            memory_type="GDDR6", bandwidth_gbps=600, l2_mb=6, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=31.2, tf32=62.5, fp16=125,
            bf16=125, fp8=None, int8=250, tensor_cores=288, interconnect_gbps=None, pcie_gen=4,
            tdp_w=150, datasheet="NVIDIA A10 Tensor Core GPU datasheet"),
    # A10G: a GA102 part made for AWS (EC2 G5), with no public NVIDIA datasheet. SMs, clock and
    # power as nvidia-smi and deviceQuery report them (80 SMs, 1710 MHz, 300 W); tensor rates as
    # AWS publishes them: half the A10's per-SM rate, like GeForce cards.
    GPUSpec("A10G", "NVIDIA", "Ampere", (8, 6), "datacenter", sms=80, memory_gb=24,
            memory_type="GDDR6", bandwidth_gbps=600, l2_mb=6, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=35.0, tf32=35.0, fp16=70,
            bf16=70, fp8=None, int8=140, tensor_cores=320, interconnect_gbps=None, pcie_gen=4,
            tdp_w=300, datasheet="Amazon EC2 G5 instance documentation (A10G)"),
    # NVIDIA Tesla V100 GPU datasheet, SXM2 column (125 "deep learning" TFLOPS = fp16 tensor).
    # No int8 tensor cores: DP4A on the CUDA cores gives about 4x the fp32 rate.
    GPUSpec("V100 SXM2 32GB", "NVIDIA", "Volta", (7, 0), "datacenter", sms=80, memory_gb=32,
            memory_type="HBM2", bandwidth_gbps=900, l2_mb=6, smem_per_sm_kb=96,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=15.7, tf32=None, fp16=125,
            bf16=None, fp8=None, int8=None, tensor_cores=640, interconnect_gbps=300, pcie_gen=3,
            tdp_w=300, datasheet="NVIDIA Tesla V100 GPU datasheet",
            aliases=("V100", "V100 SXM2", "Tesla V100-SXM2-32GB"), l2_gbps=_V100_L2_GBPS),
    # NVIDIA A100 Tensor Core GPU datasheet, 40GB SXM column.
    GPUSpec("A100 40GB SXM", "NVIDIA", "Ampere", (8, 0), "datacenter", sms=108, memory_gb=40,
            memory_type="HBM2", bandwidth_gbps=1555, l2_mb=40, smem_per_sm_kb=164,
            l1_smem_per_sm_kb=192, registers_per_sm_kb=256, fp32=19.5, tf32=156, fp16=312,
            bf16=312, fp8=None, int8=624, tensor_cores=432, interconnect_gbps=600, pcie_gen=4,
            tdp_w=400, datasheet=_A100_DS, aliases=("A100", "A100-SXM4-40GB"),
            l2_gbps=_A100_L2_GBPS),
    # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column.
    GPUSpec("A100 80GB SXM", "NVIDIA", "Ampere", (8, 0), "datacenter", sms=108, memory_gb=80,
            memory_type="HBM2e", bandwidth_gbps=2039, l2_mb=40, smem_per_sm_kb=164,
            l1_smem_per_sm_kb=192, registers_per_sm_kb=256, fp32=19.5, tf32=156, fp16=312,
            bf16=312, fp8=None, int8=624, tensor_cores=432, interconnect_gbps=600, pcie_gen=4,
            tdp_w=400, datasheet=_A100_DS, aliases=("A100-SXM4-80GB",), l2_gbps=_A100_L2_GBPS),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (halves of the sparse figures).
    GPUSpec("H100 SXM", "NVIDIA", "Hopper", (9, 0), "datacenter", sms=132, memory_gb=80,
            memory_type="HBM3", bandwidth_gbps=3350, l2_mb=50, smem_per_sm_kb=228,
            l1_smem_per_sm_kb=256, registers_per_sm_kb=256, fp32=67, tf32=494.7, fp16=989.4,
            bf16=989.4, fp8=1978.9, int8=1978.9, tensor_cores=528, interconnect_gbps=900,
            pcie_gen=5, tdp_w=700, datasheet=_H100_DS,
            aliases=("H100", "H100 SXM5", "H100 80GB HBM3")),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column (NVLink through a bridge).
    GPUSpec("H100 PCIe", "NVIDIA", "Hopper", (9, 0), "datacenter", sms=114, memory_gb=80,
            memory_type="HBM2e", bandwidth_gbps=2000, l2_mb=50, smem_per_sm_kb=228,
            l1_smem_per_sm_kb=256, registers_per_sm_kb=256, fp32=51, tf32=378, fp16=756,
            bf16=756, fp8=1513, int8=1513, tensor_cores=456, interconnect_gbps=600, pcie_gen=5,
            tdp_w=350, datasheet=_H100_DS),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: H100 SXM's compute, more and
    # faster memory.
    GPUSpec("H200", "NVIDIA", "Hopper", (9, 0), "datacenter", sms=132, memory_gb=141,
            memory_type="HBM3e", bandwidth_gbps=4800, l2_mb=50, smem_per_sm_kb=228,
            l1_smem_per_sm_kb=256, registers_per_sm_kb=256, fp32=67, tf32=494.7, fp16=989.4,
            bf16=989.4, fp8=1978.9, int8=1978.9, tensor_cores=528, interconnect_gbps=900,
            pcie_gen=5, tdp_w=700, datasheet="NVIDIA H200 Tensor Core GPU datasheet",
            aliases=("H200 SXM", "H200 141GB HBM3e")),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3080 column.
    GPUSpec("RTX 3080", "NVIDIA", "Ampere", (8, 6), "consumer", sms=68, memory_gb=10,
            memory_type="GDDR6X", bandwidth_gbps=760, l2_mb=5, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=29.8, tf32=29.8, fp16=59.5,
            bf16=59.5, fp8=None, int8=238, tensor_cores=272, interconnect_gbps=None, pcie_gen=4,
            tdp_w=320, datasheet=_GB102_WP),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3090 column (NVLink bridge).
    GPUSpec("RTX 3090", "NVIDIA", "Ampere", (8, 6), "consumer", sms=82, memory_gb=24,
            memory_type="GDDR6X", bandwidth_gbps=936, l2_mb=6, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=35.6, tf32=35.6, fp16=71,
            bf16=71, fp8=None, int8=284, tensor_cores=328, interconnect_gbps=112.5, pcie_gen=4,
            tdp_w=350, datasheet=_GB102_WP),
    # NVIDIA Ada GPU architecture whitepaper (per-SM tensor rates of the RTX 4090) scaled to
    # the GeForce RTX 4070 Ti's 60 SMs at 2610 MHz, as its product specifications give them.
    GPUSpec("RTX 4070 Ti", "NVIDIA", "Ada Lovelace", (8, 9), "consumer", sms=60, memory_gb=12,
            memory_type="GDDR6X", bandwidth_gbps=504, l2_mb=48, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=40.1, tf32=40.1, fp16=80.2,
            bf16=80.2, fp8=160.4, int8=320.7, tensor_cores=240, interconnect_gbps=None,
            pcie_gen=4, tdp_w=285, datasheet=_ADA_WP),
    # NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090 column.
    GPUSpec("RTX 4090", "NVIDIA", "Ada Lovelace", (8, 9), "consumer", sms=128, memory_gb=24,
            memory_type="GDDR6X", bandwidth_gbps=1008, l2_mb=72, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=82.6, tf32=82.6, fp16=165.2,
            bf16=165.2, fp8=330.3, int8=660.6, tensor_cores=512, interconnect_gbps=None,
            pcie_gen=4, tdp_w=450, datasheet=_ADA_WP),
    # NVIDIA RTX A6000 datasheet (309.7 sparse tensor TFLOPS; workstation cards run fp32
    # accumulate at full rate).
    GPUSpec("RTX A6000", "NVIDIA", "Ampere", (8, 6), "workstation", sms=84, memory_gb=48,
            memory_type="GDDR6", bandwidth_gbps=768, l2_mb=6, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=38.7, tf32=77.4, fp16=154.8,
            bf16=154.8, fp8=None, int8=309.7, tensor_cores=336, interconnect_gbps=112.5,
            pcie_gen=4, tdp_w=300, datasheet="NVIDIA RTX A6000 datasheet", aliases=("A6000",)),
    # NVIDIA RTX 6000 Ada Generation datasheet (1457 sparse fp8 TFLOPS).
    GPUSpec("RTX 6000 Ada", "NVIDIA", "Ada Lovelace", (8, 9), "workstation", sms=142,
            memory_gb=48, memory_type="GDDR6", bandwidth_gbps=960, l2_mb=96, smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128, registers_per_sm_kb=256, fp32=91.1, tf32=182.1, fp16=364.2,
            bf16=364.2, fp8=728.5, int8=728.5, tensor_cores=568, interconnect_gbps=None,
            pcie_gen=4, tdp_w=300, datasheet="NVIDIA RTX 6000 Ada Generation datasheet",
            aliases=("RTX 6000 Ada Generation",)),
    # AMD Instinct MI300X accelerator datasheet and AMD CDNA 3 architecture whitepaper. fp32 is
    # the vector rate (matrix cores reach 163.4); L2 is 4 MB on each of 8 dies, and a 256 MB
    # Infinity Cache sits behind it; 7 Infinity Fabric links of 128 GB/s.
    GPUSpec("MI300X", "AMD", "CDNA 3", None, "datacenter", sms=304, memory_gb=192,
            memory_type="HBM3", bandwidth_gbps=5300, l2_mb=32, smem_per_sm_kb=64,
            l1_smem_per_sm_kb=96, registers_per_sm_kb=512, fp32=81.7, tf32=653.7, fp16=1307.4,
            bf16=1307.4, fp8=2614.9, int8=2614.9, tensor_cores=1216, interconnect_gbps=896,
            pcie_gen=5, tdp_w=750, datasheet="AMD Instinct MI300X accelerator datasheet",
            aliases=("Instinct MI300X",)),
)


def list_gpus() -> list[str]:
    """The names in the spec sheet, in table order."""
    return [gpu.name for gpu in GPUS]


# Words that vendors and drivers add around the model name and that never tell models apart.
_NOISE = {"nvidia", "geforce", "tesla", "amd", "instinct", "rtx", "gpu", "tensor", "core",
          "generation", "graphics", "accelerator"}
# Tokens that make a different card when present: a query naming one the row lacks is another
# card (an "RTX 3090 Ti" is not an "RTX 3090", an "H100 NVL" is neither H100 in the table).
_DISTINGUISHING = re.compile(r"^(\d+gb|ti|super|pcie|sxm|nvl|laptop|mobile|max|ada|d|s)$")


def _tokens(name: str) -> set[str]:
    """The words of a GPU name that matter: NVIDIA A100-SXM4-80GB gives {a100, sxm, 80gb}."""
    text = re.sub(r"pci-?e", "pcie", name.lower())
    text = re.sub(r"\brtx(?=\d)", "rtx ", text)  # "rtx4090" -> "rtx 4090"
    text = re.sub(r"(\d)(ti|super)\b", r"\1 \2", text)  # "4070ti" -> "4070 ti"
    words = re.findall(r"[a-z0-9.]+", text)
    words = [re.sub(r"^sxm\d$", "sxm", w) for w in words]  # SXM2/4/5 are all "sxm"
    return {w for w in words if w not in _NOISE}


def _row_tokens(gpu: GPUSpec) -> set[str]:
    """Every token the row answers to: its name, its aliases, memory size and form factor."""
    tokens = {f"{gpu.memory_gb:g}gb", gpu.memory_type.lower()}
    for alias in (gpu.name, *gpu.aliases):
        tokens |= _tokens(alias)
    return tokens


def _model_tokens(gpu: GPUSpec) -> set[str]:
    """The tokens a query must contain: the name's, less memory size and form factor."""
    return {t for t in _tokens(gpu.name) if not re.match(r"^(\d+gb|sxm\d?|pcie)$", t)}


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """The spec of `name`, forgiving about spelling: "a100", "A100-SXM4-80GB", "NVIDIA H100 80GB
    HBM3" (torch.cuda.get_device_name's answer) all work. A name that fits several rows picks
    the best fit, then the first listed ("a100" is the A100 40GB SXM). KeyError when unknown."""
    if isinstance(name, GPUSpec):
        return name
    query = _tokens(name)
    best, best_score = None, -1
    for gpu in GPUS:
        row = _row_tokens(gpu)
        if not _model_tokens(gpu) <= query:
            continue
        if any(_DISTINGUISHING.match(t) and t not in row for t in query):
            continue  # the query names a variant this row is not
        score = len(query & row)
        if score > best_score:
            best, best_score = gpu, score
    if best is None:
        raise KeyError(f"No GPU called {name!r} in gpulab's spec sheet. Known: "
                       f"{', '.join(list_gpus())}. For another GPU, build a GPUSpec from its "
                       "datasheet (dense figures), or measure it with measure_roofline().")
    return best
