"""ZeRO-1: each data-parallel rank keeps the optimizer state of its own shard of the parameters.

    opt = ZeroOneOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss.backward()
    opt.reduce_gradients()      # average gradients over the ranks (skip it when DDP already did)
    opt.step()                  # update this rank's shard, then broadcast each shard from its owner
    opt.zero_grad()

partition_parameters   whole parameters onto ranks, greedy by size, the same answer on every rank
ZeroOneOptimizer       the inner optimizer over this rank's shard; step() broadcasts the shards
MemoryRow              bytes of parameters, gradients and optimizer state on one rank
rank_memory, memory_per_rank, optimizer_state_bytes   those bytes, measured (DTensor: local shard)
zero_memory_table      the ZeRO paper's arithmetic: DDP, ZeRO-1, ZeRO-2, ZeRO-3, bytes per rank
format_memory_table    any list of MemoryRow as a text table
compare_strategies     the same model and data under DDP, ZeRO-1 and FSDP2 (fully_shard):
                       losses step by step and bytes per rank, side by side

Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

STRATEGIES = ("DDP", "ZeRO-1", "FSDP2")  # what compare_strategies runs, in this order
_NO_STATE_DICT = (
    "ZeroOneOptimizer holds only this rank's shard of the optimizer state, so it has no whole "
    "state_dict without gathering every shard onto one rank. Save `opt.optimizer.state_dict()` "
    "on every rank (one file per rank; load it back with the same world_size), or use FSDP2 "
    "with torch.distributed.checkpoint.")


def partition_parameters(numels: list[int], world_size: int) -> list[list[int]]:
    """Which parameters each rank owns: `numels[i]` is parameter i's element count; the answer is
    one ascending list of parameter indices per rank, covering every index exactly once.

    Greedy: the largest parameter first, each to the rank with the fewest elements so far (ties:
    lowest index, lowest rank), so every rank computes the same partition without talking.
    Whole parameters, not a flat buffer cut into equal slices (DeepSpeed, FSDP1) nor each
    parameter cut along dim 0 (FSDP2's DTensor shards): the inner optimizer stays a plain torch
    optimizer over ordinary whole tensors, so any optimizer works, even one that looks at a whole
    matrix (LAMB's trust ratio, Shampoo, Muon). The price: shards are only as even as the largest
    parameter allows, and with more ranks than parameters some ranks own nothing.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    shards: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shards[rank].append(i)
        load[rank] += numels[i]
    return [sorted(shard) for shard in shards]


class ZeroOneOptimizer:
    """ZeRO stage 1 (Rajbhandari et al. 2020, P_os): optimizer state sharded over the ranks.

    Every rank holds all parameters and all gradients; the inner optimizer (built here as
    `optimizer_class(own_shard, **optimizer_kwargs)`) sees only the parameters this rank owns,
    so its state (Adam's exp_avg and exp_avg_sq) exists once across the group instead of on
    every rank. `params` may be tensors or param-group dicts, as for any torch optimizer.
    `group`: the data-parallel process group (None: all ranks).
    """

    def __init__(self, params, optimizer_class, group=None, **optimizer_kwargs):
        params = list(params)  # may be a generator, such as model.parameters()
        groups = ([dict(g, params=list(g["params"])) for g in params]
                  if params and isinstance(params[0], dict) else [{"params": params}])
        self.params = [p for g in groups for p in g["params"]]
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("a parameter appears twice in `params`")
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.partition = partition_parameters([p.numel() for p in self.params], self.world_size)
        owned = {id(self.params[i]) for i in self.partition[self.rank]}
        own_groups = [dict(g, params=[p for p in g["params"] if id(p) in owned]) for g in groups]
        own_groups = [g for g in own_groups if g["params"]]
        # torch optimizers refuse an empty parameter list: a rank that owns nothing has none.
        self.optimizer = optimizer_class(own_groups, **optimizer_kwargs) if own_groups else None

    @property
    def owned_params(self) -> list[torch.Tensor]:
        """The parameters this rank updates (and keeps optimizer state for)."""
        return [self.params[i] for i in self.partition[self.rank]]

    @torch.no_grad()
    def reduce_gradients(self, owners_only: bool = False) -> None:
        """Average the gradients over the group, for code that does not use DDP (which already
        averages them). As torch DDP with find_unused_parameters=True: a parameter no rank has
        a gradient for (frozen, or unused on every rank) keeps grad None, so the optimizer skips
        it; one that only some ranks have a gradient for gets the mean, with zeros for the
        others.

        owners_only=True reduces each gradient to its owner only (dist.reduce: like a
        reduce-scatter, about half the traffic of an all-reduce) and drops it elsewhere
        (grad=None): ZeRO-2's communication, and its saving of gradient memory.
        """
        if not self.params:
            return
        # Every rank must reduce the same parameters in the same order, or the collectives pair
        # up the wrong tensors (or hang): first agree on which parameters any rank has a
        # gradient for.
        has_grad = torch.tensor([float(p.grad is not None) for p in self.params],
                                device=self.params[0].device)
        dist.all_reduce(has_grad, group=self.group)  # > 0: some rank has a gradient
        some_rank_has = has_grad.tolist()
        for owner, indices in enumerate(self.partition):
            for p in (self.params[i] for i in indices if some_rank_has[i] > 0):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)  # this rank's share of the mean
                if owners_only:
                    dist.reduce(p.grad, dst=_global_rank(self.group, owner), group=self.group)
                else:
                    dist.all_reduce(p.grad, group=self.group)
                if owners_only and owner != self.rank:
                    p.grad = None  # what reduce leaves on other ranks is not the sum
                else:
                    p.grad.div_(self.world_size)

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shard with the inner optimizer, then copy every shard from its
        owner to all ranks, so all ranks end the step with identical parameters."""
        if self.optimizer is not None:
            self.optimizer.step()
        for owner, indices in enumerate(self.partition):
            by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
            for i in indices:  # a flat tensor has one dtype and one device
                p = self.params[i]
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            for shard in by_kind.values():  # one broadcast per owner and kind, not per tensor
                sizes = [p.numel() for p in shard]
                if owner == self.rank:
                    flat = torch.cat([p.reshape(-1) for p in shard])
                else:
                    flat = torch.empty(sum(sizes), dtype=shard[0].dtype, device=shard[0].device)
                dist.broadcast(flat, src=_global_rank(self.group, owner), group=self.group)
                if owner != self.rank:
                    for p, chunk in zip(shard, flat.split(sizes), strict=True):
                        p.copy_(chunk.view_as(p))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of all parameters (every rank holds them all in ZeRO-1)."""
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def state_dict(self):
        raise NotImplementedError(_NO_STATE_DICT)

    def load_state_dict(self, state_dict):
        raise NotImplementedError(_NO_STATE_DICT)

    def __repr__(self) -> str:
        inner = type(self.optimizer).__name__ if self.optimizer is not None else "no optimizer"
        own = sum(p.numel() for p in self.owned_params)
        return (f"ZeroOneOptimizer({inner}: rank {self.rank} of {self.world_size} owns "
                f"{len(self.owned_params)} of {len(self.params)} parameters, {own:,} of "
                f"{sum(p.numel() for p in self.params):,} elements)")


def _global_rank(group, group_rank: int) -> int:
    """Collectives name their source/destination by global rank (torch < 2.6 has no group_src)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


# ---------------------------------------------------------------- memory: measured and on paper


@dataclass(frozen=True)
class MemoryRow:
    """Bytes one rank holds for training state (activations and buffers not counted)."""

    strategy: str  # "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP2", ...
    rank: int | None  # the rank measured; None in the paper table (every rank is alike)
    param_bytes: int  # parameters (for DTensors: the local shard)
    grad_bytes: int  # gradients
    optimizer_state_bytes: int  # optimizer state (Adam: exp_avg, exp_avg_sq, step; fp32 master)

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes


def _local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for t: a DTensor (FSDP2) stores only its local shard."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in the optimizer's state on this rank (a ZeroOneOptimizer: its
    shard's state only; FSDP2: the local shards)."""
    if isinstance(optimizer, ZeroOneOptimizer):
        optimizer = optimizer.optimizer
    if optimizer is None:
        return 0
    return sum(_local_bytes(v) for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


def rank_memory(strategy: str, params, optimizer) -> MemoryRow:
    """This rank's bytes of parameters, gradients and optimizer state, measured now (measure
    after backward, before zero_grad, to count the gradients)."""
    params = list({id(p): p for p in params}.values())  # shared (tied) parameters count once
    return MemoryRow(strategy, dist.get_rank() if dist.is_initialized() else 0,
                     sum(_local_bytes(p) for p in params),
                     sum(_local_bytes(p.grad) for p in params if p.grad is not None),
                     optimizer_state_bytes(optimizer))


def memory_per_rank(strategy: str, params, optimizer, group=None) -> list[MemoryRow]:
    """rank_memory on every rank of the group, gathered: the same list, in rank order, on all
    ranks. A collective: every rank of the group must call it."""
    rows: list[MemoryRow | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(rows, rank_memory(strategy, params, optimizer), group=group)
    return rows


def zero_memory_table(n_params: int, world_size: int, param_bytes: int = 2, grad_bytes: int = 2,
                      optimizer_bytes: int = 12) -> list[MemoryRow]:
    """Bytes per rank for model states under DDP and ZeRO stages 1-3, as in the ZeRO paper.

    The defaults are the paper's mixed-precision Adam: fp16/bf16 parameters and gradients
    (2 + 2 bytes each) and K=12 bytes of fp32 optimizer state (master copy, momentum,
    variance). ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the
    parameters; a shard is n_params / world_size, rounded up.
    """
    def shard(nbytes: int) -> int:
        return math.ceil(n_params * nbytes / world_size)

    full_p, full_g, full_os = (n_params * b for b in (param_bytes, grad_bytes, optimizer_bytes))
    return [MemoryRow("DDP", None, full_p, full_g, full_os),
            MemoryRow("ZeRO-1", None, full_p, full_g, shard(optimizer_bytes)),
            MemoryRow("ZeRO-2", None, full_p, shard(grad_bytes), shard(optimizer_bytes)),
            MemoryRow("ZeRO-3", None, shard(param_bytes), shard(grad_bytes),
                      shard(optimizer_bytes))]


def format_memory_table(rows: list[MemoryRow]) -> str:
    """The rows as a text table, in one decimal unit (B, KB, MB or GB) chosen for the largest."""
    largest = max((r.total_bytes for r in rows), default=0)
    unit, scale = next(((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3))
                        if largest >= s), ("B", 1.0))
    header = ("strategy", "rank", f"params {unit}", f"grads {unit}", f"optimizer {unit}",
              f"total {unit}")
    lines = [[r.strategy, "all" if r.rank is None else str(r.rank)]
             + [f"{b / scale:.3g}" for b in (r.param_bytes, r.grad_bytes,
                                             r.optimizer_state_bytes, r.total_bytes)]
             for r in rows]
    widths = [max(len(x) for x in column) for column in zip(header, *lines, strict=True)]
    return "\n".join(line[0].ljust(widths[0]) + "".join(x.rjust(w + 2) for x, w in
                      zip(line[1:], widths[1:], strict=True)) for line in [header, *lines])


# ---------------------------------------------------------------- DDP vs ZeRO-1 vs FSDP2


@dataclass(frozen=True)
class StrategyComparison:
    """What compare_strategies measured: one model, one data stream, three ways to shard it."""

    world_size: int
    n_params: int  # parameters of the model (elements)
    losses: dict[str, list[float]]  # strategy -> loss of the whole batch at each step
    memory: list[MemoryRow]  # one row per strategy and rank, after the last backward and step

    def __str__(self) -> str:
        steps = [" ".join(f"{x:.5f}" for x in self.losses[s]) for s in self.losses]
        return "\n".join([f"{self.n_params:,} parameters over {self.world_size} ranks; losses:"]
                         + [f"  {s:<7}{line}" for s, line in zip(self.losses, steps, strict=True)]
                         + [format_memory_table(self.memory)])


def compare_strategies(world_size: int = 2, steps: int = 4, batch_size: int = 24,
                       hidden: int = 64, seed: int = 0, timeout_s: float = 120.0,
                       backend: str | None = None) -> StrategyComparison:
    """Train the same MLP on the same batches under DDP, ZeRO-1 (DDP + ZeroOneOptimizer) and
    FSDP2 (fully_shard), AdamW, fp32, on `world_size` processes; report each step's loss of the
    whole batch and each rank's bytes. The losses agree to rounding; FSDP2 holds about
    1/world_size of the parameters, gradients and state; ZeRO-1 splits only the state, and by
    whole parameters, so only as evenly as the largest parameter allows. fp32 AdamW holds
    4 + 4 bytes of parameter and gradient and 8 of state per parameter (plus a 4-byte step
    per tensor): compare with zero_memory_table(n_params, world_size, 4, 4, 8).
    backend: None for the runner's (nccl, one GPU per rank), or "gloo" to run on CPU processes,
    e.g. on a machine with fewer GPUs than ranks."""
    from gpulab.distributed.runtime.launch import run_on_ranks

    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} must be a multiple of world_size={world_size}")
    results = run_on_ranks(_compare_on_rank, world_size, steps, batch_size, hidden, seed,
                           timeout_s=timeout_s, backend=backend)
    losses, _, n_params = results[0]
    memory = [row for strategy in STRATEGIES for _, rows, _ in results for row in rows
              if row.strategy == strategy]
    return StrategyComparison(world_size, n_params, losses, memory)


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # torch 2.4, 2.5
        except ImportError as error:
            raise RuntimeError(f"FSDP2 (fully_shard) needs torch >= 2.4; this is torch "
                               f"{torch.__version__}") from error
    return fully_shard


def _compare_on_rank(rank, world_size, steps, batch_size, hidden, seed):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpulab.data import Blobs
    from gpulab.models import MLP

    on_cuda = dist.get_backend() == "nccl"  # gloo ranks stay on the CPU, even beside a GPU
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    data = Blobs(n_samples=steps * batch_size, n_classes=4, n_features=16, seed=seed)
    per_rank = batch_size // world_size
    losses, rows = {}, []
    for strategy in STRATEGIES:
        torch.manual_seed(seed)  # the same initial weights for every strategy
        model = MLP(16, 4, hidden=hidden).to(device)
        n_params = sum(p.numel() for p in model.parameters())
        if strategy == "FSDP2":
            fully_shard, mesh = _fully_shard(), init_device_mesh(device.type, (world_size,))
            for layer in model.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)  # each layer its own all-gather unit
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # states are DTensor shards
        else:
            model = DDP(model, device_ids=[device.index] if on_cuda else None)
            opt = (torch.optim.AdamW(model.parameters(), lr=1e-2) if strategy == "DDP" else
                   ZeroOneOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2))
        step_losses = []
        for step in range(steps):
            start = step * batch_size + rank * per_rank  # this rank's slice of the batch
            x = data.x[start:start + per_rank].to(device)
            y = data.y[start:start + per_rank].to(device)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if step == steps - 1:
                rows.append(rank_memory(strategy, model.parameters(), opt))
            opt.zero_grad()
            whole = loss.detach().clone()
            dist.all_reduce(whole)  # equal slices: the batch's loss is the mean of the ranks'
            step_losses.append(whole.item() / world_size)
        losses[strategy] = step_losses
    return losses, rows, n_params
