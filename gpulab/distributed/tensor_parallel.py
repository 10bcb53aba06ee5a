"""Megatron-LM tensor parallelism: the communication ops and the two parallel linear layers.

    fc = ColumnParallelLinear.from_linear(ff.fc, group)     # this rank's rows of W1 and b1
    proj = RowParallelLinear.from_linear(ff.proj, group)    # this rank's columns of W2; all of b2
    y = proj(F.gelu(fc(x)))     # x: (B, T, C) on every rank; y: (B, T, C), equal on every rank

A linear layer y = x W^T + b splits two ways over the tp_size ranks of a group:
- by output features (ColumnParallelLinear): rank r holds W[rows_r] and b[rows_r] and computes
  y[..., rows_r] from the whole x. Nothing to add up; the output is split along its last dim.
- by input features (RowParallelLinear): rank r holds W[:, cols_r] and computes the partial
  product x[..., cols_r] W[:, cols_r]^T; the partials are summed by an all-reduce. The bias is
  added once, after the sum (added on every rank first, it would count tp_size times).
Column then row (Megatron's MLP) needs no communication in between: the column layer's split
output is exactly the row layer's split input, and GELU acts element by element.

The communication ops are autograd Functions, each paired with its conjugate for backward
(Shoeybi et al. 2019, "Megatron-LM", Fig. 3: f and g; Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", sequence parallelism: g and g-bar):

    op                          forward                  backward          paper's name
    copy_to_tp                  identity                 all-reduce        f
    reduce_from_tp              all-reduce               identity          g
    split_to_tp                 my slice of last dim     all-gather
    gather_from_tp              all-gather last dim      my slice
    scatter_to_sequence         my slice of seq dim      all-gather
    gather_from_sequence        all-gather seq dim       reduce-scatter    g (SP paper)
    reduce_scatter_to_sequence  reduce-scatter seq dim   all-gather        g-bar (SP paper)

Why f all-reduces in backward: x feeds every rank's shard, so dL/dx is the sum of what each
shard contributes. The names follow megatron/core/tensor_parallel/mappings.py. Sequences are
(B, T, C) here, so the sequence dim is 1 (Megatron keeps (T, B, C) and uses dim 0).

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SEQ_DIM = 1  # (B, T, C): sequence parallelism splits T


# ---- collectives on one tensor, along one dim ---------------------------------------------------

def _tp_size(group) -> int:
    return dist.get_world_size(group)


def _identity(x, group, dim):
    return x


def _all_reduce(x, group, dim):
    # A copy: the tensor autograd hands to forward or backward may be shared with another branch
    # (the gradient of a residual add reaches both of its inputs), so never reduce it in place.
    x = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(x, group=group)
    return x


def _split(x, group, dim):
    tp_size = _tp_size(group)
    if x.size(dim) % tp_size:
        raise ValueError(f"cannot split dim {dim} of size {x.size(dim)} over tp_size={tp_size} "
                         "ranks: it must be a multiple of tp_size")
    return x.chunk(tp_size, dim)[dist.get_rank(group)].contiguous()


def _all_gather(x, group, dim):
    # The list form of all_gather works on gloo and nccl in every torch >= 2.4.
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format)
             for _ in range(_tp_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim)


def _reduce_scatter(x, group, dim):
    tp_size = _tp_size(group)
    if x.size(dim) % tp_size:
        raise ValueError(f"cannot reduce-scatter dim {dim} of size {x.size(dim)} over "
                         f"tp_size={tp_size} ranks: it must be a multiple of tp_size")
    parts = [p.contiguous() for p in x.chunk(tp_size, dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)  # rank r gets the sum of every rank's part r
    return out


def _conjugate_pair(forward, backward, name: str):
    """An autograd Function that runs `forward` on the activation and `backward` on its grad."""

    def fwd(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        if _tp_size(group) == 1:
            return x.view_as(x)  # one rank: every op is the identity
        return forward(x, group, dim)

    def bwd(ctx, grad):
        if _tp_size(ctx.group) == 1:
            return grad, None, None
        return backward(grad, ctx.group, ctx.dim), None, None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


_CopyToTP = _conjugate_pair(_identity, _all_reduce, "_CopyToTP")
_ReduceFromTP = _conjugate_pair(_all_reduce, _identity, "_ReduceFromTP")
_SplitToTP = _conjugate_pair(_split, _all_gather, "_SplitToTP")
_GatherFromTP = _conjugate_pair(_all_gather, _split, "_GatherFromTP")
_GatherFromSequence = _conjugate_pair(_all_gather, _reduce_scatter, "_GatherFromSequence")
_ReduceScatterToSequence = _conjugate_pair(_reduce_scatter, _all_gather,
                                           "_ReduceScatterToSequence")


def copy_to_tp(x, group=None):
    """f: identity forward, all-reduce of the gradient in backward. Put it where a replicated
    activation enters the tensor-parallel region."""
    return _CopyToTP.apply(x, group, -1)


def reduce_from_tp(x, group=None):
    """g: all-reduce forward (sum the partial outputs), identity backward. Where the region ends."""
    return _ReduceFromTP.apply(x, group, -1)


def split_to_tp(x, group=None):
    """Keep this rank's slice of the last dim; backward all-gathers the gradient."""
    return _SplitToTP.apply(x, group, -1)


def gather_from_tp(x, group=None):
    """All-gather the last dim (rank order); backward keeps this rank's slice of the gradient,
    which is right when what follows is replicated, the same on every rank."""
    return _GatherFromTP.apply(x, group, -1)


def scatter_to_sequence(x, group=None, dim: int = SEQ_DIM):
    """Keep this rank's slice of the sequence; backward all-gathers. Enters a sequence-parallel
    region from a replicated activation (the embeddings' output, say)."""
    return _SplitToTP.apply(x, group, dim)


def gather_from_sequence(x, group=None, dim: int = SEQ_DIM):
    """g of sequence parallelism: all-gather the sequence shards before a column-parallel layer;
    backward reduce-scatters (each rank's gradient of the whole sequence is a partial sum)."""
    return _GatherFromSequence.apply(x, group, dim)


def reduce_scatter_to_sequence(x, group=None, dim: int = SEQ_DIM):
    """g-bar of sequence parallelism: after a row-parallel layer, sum the partial outputs and keep
    this rank's sequence shard (half the traffic of an all-reduce); backward all-gathers."""
    return _ReduceScatterToSequence.apply(x, group, dim)


# ---- the layers ---------------------------------------------------------------------------------

def _shard_range(size: int, group, what: str) -> tuple[int, int]:
    tp_size, tp_rank = _tp_size(group), dist.get_rank(group)
    if size % tp_size:
        raise ValueError(f"{what}={size} is not a multiple of tp_size={tp_size}: every rank "
                         "must hold an equal shard")
    per_rank = size // tp_size
    return tp_rank * per_rank, (tp_rank + 1) * per_rank


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's rows (output features) split: this rank holds out_features/tp_size.

    Input: the whole x, the same on every rank (f before the matmul), or with
    sequence_parallel=True this rank's sequence shard (all-gathered first, g).
    Output: this rank's slice of y's last dim, or all of y with gather_output=True.
    n_fused > 1: the layer is n_fused linears of out_features/n_fused each side by side (q, k, v),
    and each rank holds its slice of EACH, so the local output is [q_r, k_r, v_r].
    """

    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True,
                 gather_output: bool = False, sequence_parallel: bool = False, n_fused: int = 1):
        super().__init__()
        if out_features % n_fused or (gather_output and n_fused > 1):
            raise ValueError(f"out_features={out_features} must be a multiple of n_fused={n_fused}"
                             ", and a fused layer's output stays split (gathered, it would "
                             "interleave the ranks' [q_r, k_r, v_r])")
        self.group, self.gather_output, self.n_fused = group, gather_output, n_fused
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        self.start, self.end = _shard_range(out_features // n_fused, group, "out_features")
        local = (self.end - self.start) * n_fused
        bound = 1 / math.sqrt(in_features)  # nn.Linear's init, drawn for this shard only
        self.weight = nn.Parameter(torch.empty(local, in_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(local).uniform_(-bound, bound)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **kwargs) -> ColumnParallelLinear:
        """This rank's shard of a whole nn.Linear (same values: compare with the original)."""
        return cls.from_linears([linear], group, **kwargs)

    @classmethod
    def from_linears(cls, linears: list[nn.Linear], group=None, **kwargs) -> ColumnParallelLinear:
        """One layer holding this rank's slice of each of several linears with the same input
        (q, k and v: the slices are this rank's heads of each)."""
        first = linears[0]
        has_bias = first.bias is not None
        layer = cls(first.in_features, sum(lin.out_features for lin in linears), group,
                    bias=has_bias, n_fused=len(linears), **kwargs)
        with torch.no_grad():
            layer.weight.copy_(layer.shard_of(torch.cat([lin.weight for lin in linears])))
            if has_bias:
                layer.bias.copy_(layer.shard_of(torch.cat([lin.bias for lin in linears])))
        return layer

    def shard_of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a whole (out_features, ...) tensor: the weight, the bias, or their
        gradients in an unsharded model (that is how the tests compare)."""
        parts = full.reshape(self.n_fused, -1, *full.shape[1:])  # (n_fused, out/n_fused, ...)
        return parts[:, self.start:self.end].reshape(-1, *full.shape[1:])

    def forward(self, x):  # (B, T, in) or, sequence-parallel, (B, T/tp_size, in)
        if self.sequence_parallel:
            x = gather_from_sequence(x, self.group)  # (B, T, in)
        else:
            x = copy_to_tp(x, self.group)
        y = F.linear(x, self.weight, self.bias)  # (B, T, out/tp_size)
        return gather_from_tp(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(rows {self.start}:{self.end} of each of {self.n_fused}), "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's columns (input features) split: this rank holds in_features/tp_size.

    Input: this rank's slice of x's last dim (input_is_parallel=True, what a ColumnParallelLinear
    gives), or the whole x, sliced here. Each rank's product is a partial sum of y: all-reduced
    (g), or with sequence_parallel=True reduce-scattered to this rank's sequence shard (g-bar).
    The bias is whole on every rank and added once, after the sum. With sequence_parallel, each
    rank's bias gradient covers only its shard: sync_sequence_parallel_grads adds them up.
    """

    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True,
                 input_is_parallel: bool = True, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.input_is_parallel = group, input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        self.start, self.end = _shard_range(in_features, group, "in_features")
        bound = 1 / math.sqrt(in_features)
        self.weight = nn.Parameter(
            torch.empty(out_features, self.end - self.start).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound)) if bias \
            else None
        if self.bias is not None:
            self.bias.sequence_parallel = sequence_parallel

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **kwargs) -> RowParallelLinear:
        """This rank's shard of a whole nn.Linear (same values: compare with the original)."""
        layer = cls(linear.in_features, linear.out_features, group,
                    bias=linear.bias is not None, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(layer.shard_of(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def shard_of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a whole (out, in) weight; a bias (1-D) is not sharded."""
        return full[..., self.start:self.end] if full.dim() == 2 else full

    def forward(self, x):  # (B, T, in/tp_size), or (B, T, in) with input_is_parallel=False
        if not self.input_is_parallel:
            x = split_to_tp(x, self.group)
        partial = F.linear(x, self.weight)  # (B, T, out): this rank's share of the sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence(partial, self.group)  # (B, T/tp_size, out)
        else:
            y = reduce_from_tp(partial, self.group)  # (B, T, out)
        return y if self.bias is None else y + self.bias  # once, after the sum

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (columns {self.start}:{self.end}), "
                f"out_features={self.out_features}, sequence_parallel={self.sequence_parallel}")


def sync_sequence_parallel_grads(module: nn.Module, group=None) -> int:
    """All-reduce, in one message, the gradients of the parameters marked `sequence_parallel`
    (layernorms and row-parallel biases inside a sequence-parallel region): each rank saw only
    its shard of the sequence, so each holds a partial gradient. Megatron-LM does this once per
    step, after backward (finalize_model_grads). Returns the number of gradients reduced."""
    grads = [p.grad for p in module.parameters()
             if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if grads and _tp_size(group) > 1:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        for g, reduced in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(reduced.view_as(g))
    return len(grads)
