"""The same tensor parallelism through torch's DTensor: a plan, and parallelize_module.

    tp_mesh = device_mesh(RankGrid(dp_size, 1, tp_size))["tp"]      # or init_device_mesh
    tp_block = parallelize_block(model.blocks[0], tp_mesh)            # a sharded copy
    y = tp_block(x)                                                   # x, y: plain (B, T, C)
    tp_block.attn.q_proj.weight          # DTensor, Shard(0): this rank's rows, .to_local()

block_tp_plan      {submodule name: ParallelStyle} for a gpulab.models.Block, the plan
                   torchtitan writes for Llama: q, k, v and fc ColwiseParallel, out_proj and proj
                   RowwiseParallel; with sequence_parallel=True, the layernorms SequenceParallel
                   (on this rank's T/tp_size tokens) and PrepareModuleInput all-gathering the
                   sequence before attention and the MLP, whose row-parallel layers then
                   reduce-scatter their output back to Shard(1).
parallelize_block  parallelize_module on a copy of the Block with that plan.

What differs from the hand-written version (tp_transformer), as the tests measure it:
- q, k and v stay three layers, so backward all-reduces three input gradients where a fused qkv
  needs one: 4 all-reduces in a Block's backward instead of 2 (the bytes triple for attention).
- With sequence parallelism, a layernorm's gradient comes back as a DTensor with placement
  Partial(sum): the sum over ranks is taken when it is used (the optimizer's step redistributes
  it), with no explicit sync_sequence_parallel_grads.
Both run on CPU with gloo in torch 2.13; the module needs torch >= 2.5 (torch.distributed.tensor).

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import copy

from torch import nn


def block_tp_plan(sequence_parallel: bool = False) -> dict:
    """The parallelize_module plan for a gpulab.models.Block (names are its submodules')."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    # Row-parallel output: the whole (B, T, C) summed on every rank (all-reduce), or with
    # sequence parallelism this rank's T shard of the sum (reduce-scatter to Shard(1)).
    row_out = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "attn.q_proj": ColwiseParallel(),  # by output features, i.e. by heads
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.out_proj": RowwiseParallel(output_layouts=row_out),
        "ff.fc": ColwiseParallel(),
        "ff.proj": RowwiseParallel(output_layouts=row_out),
    }
    if sequence_parallel:
        gather_sequence = PrepareModuleInput(input_layouts=(Shard(1),),
                                             desired_input_layouts=(Replicate(),))
        plan.update({"ln_1": SequenceParallel(), "ln_2": SequenceParallel(),
                     "attn": gather_sequence, "ff": copy.deepcopy(gather_sequence)})
    return plan


def parallelize_block(block: nn.Module, tp_mesh, sequence_parallel: bool = False) -> nn.Module:
    """A copy of a gpulab.models.Block sharded over a 1-D DeviceMesh (the TP axis). It takes
    and returns plain tensors: (B, T, C), or this rank's (B, T/tp_size, C) with
    sequence_parallel. CausalSelfAttention reads its number of heads from the projections'
    width, so the unchanged forward runs on this rank's n_head/tp_size heads."""
    from torch.distributed.tensor.parallel import parallelize_module

    n_head = block.attn.q_proj.out_features // block.attn.head_size
    if n_head % tp_mesh.size():
        raise ValueError(f"n_head={n_head} is not a multiple of the mesh size "
                         f"{tp_mesh.size()}: tensor parallelism gives each rank whole heads")
    return parallelize_module(copy.deepcopy(block), tp_mesh, block_tp_plan(sequence_parallel))
