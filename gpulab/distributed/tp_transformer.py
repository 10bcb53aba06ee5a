"""A GPT Block split over tensor-parallel ranks, Megatron-LM style, with or without sequence
parallelism, and the communication it costs.

    tp_block = tp_block_from(model.blocks[0], group)              # x, y: (B, T, C), replicated
    tp_block = tp_block_from(block, group, sequence_parallel=True)
    y_shard = tp_block(x_shard)                                   # (B, T/tp_size, C) in and out
    loss.backward(); sync_sequence_parallel_grads(tp_block, group)

TPFeedForward           fc column-parallel, proj row-parallel: one all-reduce forward (g), one
                        backward (f). Each rank holds 4C/tp_size of the hidden units.
TPCausalSelfAttention   q, k, v column-parallel by heads (one fused layer: this rank's heads of
                        each), attention on this rank's n_head/tp_size heads with no
                        communication, out_proj row-parallel: again one all-reduce each way.
TPBlock                 the layernorms and residual adds around them. Without sequence
                        parallelism they run on the whole (B, T, C) on every rank, the same
                        work tp_size times. With it (Korthikanti et al. 2022) they run on this
                        rank's T/tp_size tokens: the all-reduce becomes a reduce-scatter (g-bar)
                        after the row-parallel layer and an all-gather (g) before the column-
                        parallel one, the same bytes, and the activations outside the TP region
                        take 1/tp_size of the memory.
tp_block_from           a TPBlock from a gpulab.models.Block: the tests compare it with the
                        unsharded Block, outputs and gradients.
tp_layer_comm           bytes per token a layer sends, TP vs TP + sequence parallelism.

Dropout: in this version a dropout inside the TP region (attention weights) or on a replicated
activation would need per-rank RNG streams kept in step (Megatron's CudaRNGStatesTracker); the
equality tests run with dropout 0. With sequence parallelism, the gathered input of each
column-parallel layer is kept for backward; Megatron-LM keeps only the shard and all-gathers it
again in backward, to save that memory too.

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpulab.distributed.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    sync_sequence_parallel_grads,
)


class TPFeedForward(nn.Module):
    """gpulab.models.FeedForward with fc split by output features and proj by input features."""

    def __init__(self, ff: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.fc = ColumnParallelLinear.from_linear(ff.fc, group,
                                                   sequence_parallel=sequence_parallel)
        self.proj = RowParallelLinear.from_linear(ff.proj, group,
                                                  sequence_parallel=sequence_parallel)
        self.drop = copy.deepcopy(ff.drop)

    def forward(self, x):  # (B, T, C), or (B, T/tp_size, C) with sequence parallelism
        h = F.gelu(self.fc(x))  # (B, T, 4C/tp_size): element-wise, so no communication
        return self.drop(self.proj(h))  # (B, T, C) summed over ranks (or this rank's T shard)


class TPCausalSelfAttention(nn.Module):
    """gpulab.models.CausalSelfAttention with this rank's n_head/tp_size heads."""

    def __init__(self, attn: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        n_head = attn.q_proj.out_features // attn.head_size
        tp_size = dist.get_world_size(group)
        if n_head % tp_size:
            raise ValueError(f"n_head={n_head} is not a multiple of tp_size={tp_size}: "
                             "tensor parallelism gives each rank whole heads")
        # Head h is columns h*hs:(h+1)*hs of each projection's output, so this rank's
        # contiguous rows of q_proj, k_proj and v_proj are whole heads. Fused into one layer,
        # each rank holds [q_r; k_r; v_r], NOT a contiguous third of the stacked [q; k; v].
        self.qkv = ColumnParallelLinear.from_linears(
            [attn.q_proj, attn.k_proj, attn.v_proj], group, sequence_parallel=sequence_parallel)
        self.out_proj = RowParallelLinear.from_linear(attn.out_proj, group,
                                                      sequence_parallel=sequence_parallel)
        self.head_size, self.dropout = attn.head_size, attn.dropout
        self.resid_drop = copy.deepcopy(attn.resid_drop)

    def forward(self, x):  # (B, T, C), or (B, T/tp_size, C) with sequence parallelism
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (B, T, C/tp_size): this rank's heads
        B, T = q.shape[:2]
        q, k, v = (t.view(B, T, -1, self.head_size).transpose(1, 2)  # (B, nh/tp, T, hs)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C/tp_size)
        return self.resid_drop(self.out_proj(y))  # (B, T, C) (or this rank's T shard)


class TPBlock(nn.Module):
    """x + attn(ln_1(x)), then x + ff(ln_2(x)), with attn and ff tensor-parallel."""

    def __init__(self, block: nn.Module, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.ln_1, self.ln_2 = copy.deepcopy(block.ln_1), copy.deepcopy(block.ln_2)
        self.attn = TPCausalSelfAttention(block.attn, group, sequence_parallel)
        self.ff = TPFeedForward(block.ff, group, sequence_parallel)
        for ln in (self.ln_1, self.ln_2):
            for p in ln.parameters():  # a replicated weight applied to a sequence shard
                p.sequence_parallel = sequence_parallel

    def forward(self, x):  # (B, T, C), or (B, T/tp_size, C) with sequence parallelism
        x = x + self.attn(self.ln_1(x))
        return x + self.ff(self.ln_2(x))

    def sync_sequence_parallel_grads(self) -> int:
        """After backward, with sequence parallelism: sum the layernorms' and row-parallel
        biases' partial gradients over the TP group (see tensor_parallel)."""
        return sync_sequence_parallel_grads(self, self.group)


def tp_block_from(block: nn.Module, group=None, sequence_parallel: bool = False) -> TPBlock:
    """This rank's tensor-parallel shard of a gpulab.models.Block (the Block is not changed)."""
    return TPBlock(block, group, sequence_parallel)


def apply_tensor_parallel(model: nn.Module, group=None) -> nn.Module:
    """A copy of a gpulab.models.GPT whose Blocks are TPBlocks (no sequence parallelism): the
    embeddings, final layernorm and lm_head stay whole on every rank, so the logits are too."""
    model = copy.deepcopy(model)
    model.blocks = nn.ModuleList(tp_block_from(b, group) for b in model.blocks)
    return model


# ---- communication accounting -----------------------------------------------------------------

@dataclass(frozen=True)
class LayerComm:
    """What one transformer layer sends per token over its TP group, forward and backward."""

    sequence_parallel: bool
    tp_size: int
    forward: tuple[str, ...]  # the activation collectives of one forward, in order
    backward: tuple[str, ...]  # ... of one backward
    message_bytes: int  # one token's activation, C * bytes_per_element: each collective's size
    sent_forward: float  # bytes one rank sends per token in forward (ring algorithms)
    sent_backward: float  # ... in backward


# Bytes one rank sends, as a multiple of the message, with the ring algorithms (lesson 04):
# an all-reduce is a reduce-scatter followed by an all-gather.
_RING_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
                "reduce_scatter": lambda p: (p - 1) / p}


def tp_layer_comm(n_embd: int, tp_size: int, sequence_parallel: bool = False,
                  bytes_per_element: int = 2) -> LayerComm:
    """The collectives of one Block (attention + MLP) per token: TP all-reduces twice forward
    (after each row-parallel layer) and twice backward (at each f); sequence parallelism
    replaces each all-reduce by an all-gather and a reduce-scatter of the same message, so it
    sends the same bytes (Korthikanti et al. 2022). bytes_per_element: 2 for bf16."""
    if sequence_parallel:
        forward = ("all_gather", "reduce_scatter") * 2  # g before qkv, g-bar after out_proj, ...
        backward = ("all_gather", "reduce_scatter") * 2  # g-bar's backward, then g's
    else:
        forward = backward = ("all_reduce",) * 2
    message = n_embd * bytes_per_element

    def sent(ops):
        return sum(_RING_FACTOR[op](tp_size) for op in ops) * message

    return LayerComm(sequence_parallel, tp_size, forward, backward, message,
                     sent(forward), sent(backward))


def count_collectives(fn) -> dict[str, int]:
    """Run fn() and count the collectives it issued, by kind ("all_reduce", "all_gather",
    "reduce_scatter"), with torch's CommDebugMode (it sees plain dist.* calls and DTensor's)."""
    from torch.distributed.tensor.debug import CommDebugMode

    mode = CommDebugMode()
    with mode:
        fn()
    counts: dict[str, int] = {}
    for op, n in mode.get_comm_counts().items():
        name = str(op).split(".")[-1].rstrip("_")  # c10d.allreduce_, _c10d_functional.all_reduce
        kind = {"allreduce": "all_reduce", "allgather": "all_gather",
                "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
                "_reduce_scatter_base": "reduce_scatter", "_allgather_base": "all_gather",
                "reduce_scatter": "reduce_scatter"}.get(name, name)
        counts[kind] = counts.get(kind, 0) + n
    return counts
