"""Bytes per parameter: precision recipes, optimizers and ZeRO sharding (the napkin math).

    bytes_per_parameter("mixed", "adam")          # (2, 2, 12): the ZeRO paper's 16 bytes
    bytes_per_parameter("fp32", "adam")           # (4, 4, 8)
    model_states(7e9, "mixed", "adam", zero_stage=3, world_size=8)   # a MemoryRow per rank

A recipe says how weights, gradients, optimizer state and activations are stored:

    fp32           everything in fp32
    bf16-autocast  torch.autocast(dtype=bfloat16), what the course runs on the CPU: fp32 weights,
                   gradients and state; matmuls and convolutions see bf16 copies of their inputs
                   and weights (the copies of the weights are cached for the forward pass and
                   saved for backward), so activations are mostly bf16
    fp16-autocast  the same with fp16 and a GradScaler, what the course runs on CUDA GPUs
                   without bf16 (the scaler's few bytes are not counted)
    bf16           the model itself in bf16 (model.to(torch.bfloat16)): weights, gradients,
                   activations and optimizer state all in 2 bytes
    mixed          16-bit weights, gradients and activations, and in the optimizer an fp32
                   master copy next to fp32 moments (Megatron-LM, DeepSpeed; the ZeRO paper's
                   2 + 2 + 12 bytes per parameter with Adam)

Optimizers keep state per parameter element: SGD none, SGD with momentum one buffer, Adam and
AdamW two (exp_avg, exp_avg_sq) and a step count per tensor. 8-bit optimizers (bitsandbytes'
Adam8bit) store both moments in one byte each, quantized blockwise with one fp32 scale per block
of 2048 values: about 2 bytes per parameter instead of 8, for the same update quality in most
fine-tuning runs; with 16-bit weights that makes 2 + 2 + 2 (or + 4 with a master copy).

ZeRO splits these model states over the data-parallel ranks (stage 1: optimizer state, stage
2: also gradients, stage 3: also parameters): see gpulab.distributed.zero.zero_memory_table,
which model_states uses, so the two always agree.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpulab.distributed.zero import MemoryRow, zero_memory_table


@dataclass(frozen=True)
class Recipe:
    """How one precision recipe stores a training step's tensors."""

    name: str
    param_itemsize: int  # bytes per weight as stored (and per gradient)
    compute_itemsize: int  # bytes per element of matmul/conv operands and outputs
    autocast: bool  # torch.autocast: low-precision copies made on the fly, weights stay fp32
    master_weights: bool  # the optimizer keeps an fp32 copy of 16-bit weights


RECIPES = {
    "fp32": Recipe("fp32", 4, 4, False, False),
    "bf16-autocast": Recipe("bf16-autocast", 4, 2, True, False),
    "fp16-autocast": Recipe("fp16-autocast", 4, 2, True, False),
    "bf16": Recipe("bf16", 2, 2, False, False),
    "mixed": Recipe("mixed", 2, 2, False, True),
}
OPTIMIZER_MOMENTS = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}


def recipe(precision) -> Recipe:
    """A Recipe from its name, from an AutocastRecipe (gpulab.runner.autocast), or fp32 for
    None."""
    if precision is None:
        return RECIPES["fp32"]
    if isinstance(precision, Recipe):
        return precision
    if hasattr(precision, "dtype_name"):  # an AutocastRecipe
        return RECIPES["bf16-autocast" if precision.dtype_name == "bfloat16" else
                       "fp16-autocast"]
    if precision not in RECIPES:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(RECIPES)}, "
                         "an AutocastRecipe, or None for fp32")
    return RECIPES[precision]


def optimizer_kind(optimizer) -> str:
    """'sgd', 'sgd-momentum', 'adam' or 'adamw', from that name or from a torch optimizer."""
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZER_MOMENTS:
            raise ValueError(f"unknown optimizer {optimizer!r}; choose one of "
                             f"{', '.join(OPTIMIZER_MOMENTS)}, or pass a torch optimizer")
        return optimizer
    name = type(optimizer).__name__.lower()
    if name == "sgd":
        return "sgd-momentum" if optimizer.defaults.get("momentum", 0) else "sgd"
    if name in ("adam", "adamw"):
        return name
    raise ValueError(f"no memory model for {type(optimizer).__name__}: pass 'sgd', "
                     "'sgd-momentum', 'adam' or 'adamw' for the closest one")


def optimizer_itemsizes(precision, optimizer) -> list[int]:
    """Bytes per parameter element of each state tensor: fp32 Adam [4, 4]; mixed Adam
    [4, 4, 4] (master copy, exp_avg, exp_avg_sq); bf16 Adam [2, 2] (state follows the weight)."""
    r, moments = recipe(precision), OPTIMIZER_MOMENTS[optimizer_kind(optimizer)]
    if r.master_weights:
        return [4] * (1 + moments)
    return [r.param_itemsize] * moments


def bytes_per_parameter(precision, optimizer) -> tuple[int, int, int]:
    """(weight, gradient, optimizer state) bytes per parameter."""
    r = recipe(precision)
    return r.param_itemsize, r.param_itemsize, sum(optimizer_itemsizes(precision, optimizer))


def model_states(n_params: int, precision="mixed", optimizer="adam", zero_stage: int = 0,
                 world_size: int = 1) -> MemoryRow:
    """Bytes of parameters, gradients and optimizer state on one rank: the row of
    zero_memory_table for this stage (stage 0 is plain data parallelism, or one device)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    row = zero_memory_table(int(n_params), world_size,
                            *bytes_per_parameter(precision, optimizer))[zero_stage]
    return row if world_size > 1 else dataclasses.replace(row, strategy="one device")


def transformer_params(n_layer: int, n_embd: int, vocab_size: int, block_size: int) -> int:
    """Parameters of the course's GPT: token and position embeddings, n_layer Blocks of
    12 C^2 + 13 C (q, k, v, out: 4 C^2 + 4 C; feed-forward: 8 C^2 + 5 C; two LayerNorms: 4 C),
    a final LayerNorm (2 C) and an untied lm_head (V C)."""
    C = n_embd
    return (vocab_size * C + block_size * C + n_layer * (12 * C * C + 13 * C) + 2 * C
            + vocab_size * C)
