"""Memory calculator: a GPT's training-step memory per GPU, from the choices that move it.

    ex = memory_explorer()                       # GPT-3 6.7B shape, mixed precision, Adam, 1 GPU
    ex.result.estimate.model_states().total_bytes     # 16 bytes per parameter: 107 GB
    ex.set(zero_stage=3, world_size=8)           # ZeRO-3 shards them: 2 bytes per param per GPU
    ex.set(checkpointing=True)                   # activations: one input per Block

Model size, precision recipe, optimizer, ZeRO stage, world size, micro-batch and activation
checkpointing go into gpulab.memory.estimate_transformer (bytes per parameter from
gpulab.memory.recipes, ZeRO sharding from gpulab.distributed.zero, a step replayed on paper);
the picture is its napkin sum and its peak, by category.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab import hardware
from gpulab.explorers.base import Control, Explorer
from gpulab.memory.recipes import OPTIMIZER_MOMENTS, RECIPES

# name -> (n_layer, n_embd, n_head, seq_len, vocab_size), in the course's GPT architecture
# (learned positions, 4x GELU feed-forward, untied head), so sizes are close to, not exactly,
# the published models'.
MODELS = {
    "GPT-2 small (124M)": (12, 768, 12, 1024, 50257),
    "GPT-2 XL (1.5B)": (48, 1600, 25, 1024, 50257),
    "GPT-3 6.7B": (32, 4096, 32, 2048, 50257),
    "13B (40 x 5120)": (40, 5120, 40, 2048, 50257),
}
WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
CONTEXT_BYTES = 512 * 2**20  # CUDA context and kernels, left free (MemoryEstimate.fits_on)


@dataclass(frozen=True)
class MemoryPlan:
    """A training step's memory on one GPU, and whether it fits."""

    model: str  # a key of MODELS
    estimate: object  # gpulab.memory.MemoryEstimate, on paper, per rank
    gpu: hardware.GPUSpec
    fits: bool  # peak + CONTEXT_BYTES within the GPU's memory


def memory_plan(model: str = "GPT-3 6.7B", precision: str = "mixed", optimizer: str = "adam",
                zero_stage: int = 0, world_size: int = 1, batch_size: int = 1,
                checkpointing: bool = False, gpu: str = "H100 SXM") -> MemoryPlan:
    """The pure function behind the explorer: estimate_transformer on CUDA for one model shape.
    ValueError for ZeRO on one GPU (it shards over data-parallel ranks)."""
    from gpulab.memory import estimate_transformer

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    n_layer, n_embd, n_head, seq_len, vocab_size = MODELS[model]
    est = estimate_transformer(n_layer, n_embd, n_head, seq_len, batch_size, vocab_size,
                               precision=precision, optimizer=optimizer, device_type="cuda",
                               zero_stage=zero_stage, world_size=world_size,
                               checkpointing=checkpointing)
    spec = hardware.get_gpu(gpu)
    return MemoryPlan(model, est, spec, est.fits_on(spec, CONTEXT_BYTES))


def describe_plan(p: MemoryPlan) -> str:
    e, GiB = p.estimate, 2**30
    states = e.model_states()
    per_param = states.total_bytes / e.n_params  # bytes of model states per parameter, here
    return "\n".join([
        e.table(),
        f"model states {states.total_bytes / GiB:.1f} GiB per GPU = {per_param:.3g} bytes per "
        f"parameter (weights, gradients, optimizer state)",
        f"{p.gpu.name} ({p.gpu.memory_gb:g} GB): "
        + ("fits" if p.fits else "does NOT fit")
        + f" (peak {e.peak_bytes / GiB:.1f} GiB + {CONTEXT_BYTES / GiB:.1f} GiB for the CUDA "
        "context)",
    ])


def draw_plan(p: MemoryPlan):
    from matplotlib.figure import Figure

    from gpulab.viz import DPI

    fig = Figure(figsize=(7.5, 2.4), dpi=DPI)
    ax = p.estimate.plot(ax=fig.subplots())
    ax.set_xlabel("MiB per GPU")
    ax.set_title(f"{p.model}: peak {p.estimate.peak_bytes / 2**30:.1f} GiB per GPU",
                 fontsize=10)
    fig.tight_layout()
    return fig


def memory_explorer(interactive: bool | None = None, **values) -> Explorer:
    """Model size, precision recipe, optimizer, ZeRO stage, world size, micro-batch and
    checkpointing -> memory per GPU by category, and whether it fits the chosen GPU.
    values: start values of the controls."""
    controls = [
        Control("model", "model", "GPT-3 6.7B", tuple(MODELS)),
        Control("precision", "precision recipe", "mixed", tuple(RECIPES)),
        Control("optimizer", "optimizer", "adam", tuple(OPTIMIZER_MOMENTS)),
        Control("zero_stage", "ZeRO stage", 0, (0, 1, 2, 3)),
        Control("world_size", "data-parallel GPUs", 1, WORLD_SIZES),
        Control("batch_size", "micro-batch per GPU", 1, BATCH_SIZES),
        Control("checkpointing", "activation checkpointing", False, kind="checkbox"),
        Control("gpu", "GPU", "H100 SXM", tuple(hardware.list_gpus())),
    ]
    return Explorer("Memory calculator", controls, memory_plan, describe_plan, draw_plan,
                    values, interactive)
