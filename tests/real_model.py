"""A model with what real models have and a plain MLP lacks, and the loop that trains it, for
the DDP and ZeRO-1 tests (test_distributed_data_parallel.py, test_distributed_zero.py). What
torch DDP with find_unused_parameters=True does with each part, and so must gpulab:

    frozen                no gradient, no communication: grad stays None, weights never change
    unused on every rank  grad stays None on every rank, so the optimizer skips it (AdamW's
                          weight decay would move it even with a zero gradient)
    used on some ranks    the mean over all ranks, with zeros for the ranks that did not use it
    bf16 beside fp32      a bf16 gradient, reduced in a bucket of its own dtype
"""

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 3
BATCH = 12  # divides by 2 and by 3: every rank gets an equal slice
FROZEN = ("frozen.weight", "frozen.bias")
UNUSED = ("unused.weight", "unused.bias")
PARTLY = ("partly.weight", "partly.bias")  # used by rank 0 only
# AdamW's weight decay moves a weight that has a zero gradient: a parameter that should have no
# gradient (grad None, skipped by the optimizer) shows it if it got one.
ADAMW = dict(lr=0.01, weight_decay=0.1)
# bf16 keeps 8 significant bits. (On 2 ranks the weights come out bit for bit equal: the ranks'
# (a + b) / 2 is one process's a / 2 + b / 2 from two half-batch losses, since halving is exact.)
TOLERANCE = {torch.bfloat16: dict(rtol=1e-2, atol=1e-2), torch.float32: dict(rtol=1e-5, atol=1e-5)}


class RealModel(nn.Module):
    """Frozen fp32 layer -> bf16 layer -> fp32 head, plus two more heads: `unused`, which no
    forward takes, and `partly`, which forward(x, partly=True) adds (rank 0's slices only).
    branches=False leaves those two out: a model every rank uses whole."""

    def __init__(self, seed: int, branches: bool = True):
        super().__init__()
        torch.manual_seed(seed)
        self.frozen = nn.Linear(8, 16).requires_grad_(False)  # a pretrained embedding, say
        self.low = nn.Linear(16, 16, dtype=torch.bfloat16)
        self.high = nn.Linear(16, 3)
        if branches:
            self.unused = nn.Linear(16, 3)
            self.partly = nn.Linear(16, 3)

    def forward(self, x, partly=False):
        h = self.frozen(x).relu()  # (B, 16)
        h = self.low(h.bfloat16()).float().relu()  # (B, 16), computed in bf16
        y_hat = self.high(h)  # (B, 3)
        return y_hat + self.partly(h) if partly else y_hat


def rank_batch(rank: int, world_size: int, branches: bool = True):
    """Rank `rank`'s slice of the batch as (x, y, forward kwargs, loss weight)."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 8, generator=g), torch.randint(0, 3, (BATCH,), generator=g)
    n = BATCH // world_size
    mine = slice(rank * n, (rank + 1) * n)
    return x[mine], y[mine], {"partly": branches and rank == 0}, 1.0


def one_process_batches(world_size: int, branches: bool = True):
    """What one process runs for the same step: every rank's slice, each loss weighted
    1 / world_size, accumulated (the mean of the ranks' means, as DDP averages them)."""
    return [(*rank_batch(r, world_size, branches)[:3], 1 / world_size)
            for r in range(world_size)]


def adamw(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), **ADAMW)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter, by name (a wrapper's "module." prefix dropped)."""
    return {name.removeprefix("module."): p.detach().clone()
            for name, p in model.named_parameters()}


def train(model, optimizer, micro_batches, after_backward=None, steps=STEPS):
    """`steps` optimizer steps, each accumulating every micro-batch, then after_backward() (a
    DDP wrapper's finish_gradient_sync, a ZeroOneOptimizer's reduce_gradients). Returns the
    parameters after each step, and the dtype of each gradient after the last (None: no grad)."""
    history = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for x, y, kwargs, weight in micro_batches:
            (weight * F.cross_entropy(model(x, **kwargs), y)).backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
        history.append(snapshot(model))
    grads = {name.removeprefix("module."): None if p.grad is None else p.grad.dtype
             for name, p in model.named_parameters()}
    return history, grads


def assert_trains_like(per_rank: list, want: list, what: str) -> None:
    """Every rank's parameters identical to rank 0's after every step, rank 0's equal to `want`
    (one process) within its dtype's tolerance, frozen and unused ones never changed at all."""
    start = snapshot(RealModel(0, branches=UNUSED[0] in want[0]))
    for step, expected in enumerate(want):
        for rank, history in enumerate(per_rank):
            for name, p in history[step].items():
                assert torch.equal(p, per_rank[0][step][name]), (
                    f"{what}, step {step}: rank {rank}'s {name} differs from rank 0's; every "
                    "rank must apply the same averaged gradient")
        for name, p in per_rank[0][step].items():
            torch.testing.assert_close(
                p, expected[name], **TOLERANCE[p.dtype],
                msg=lambda m, s=step, n=name: f"{what}, step {s}, {n}: != one process. {m}")
            if name in FROZEN + UNUSED:
                assert torch.equal(p, start[name]), (
                    f"{what}, step {step}: {name} changed. A frozen parameter, or one no rank "
                    "used, must keep grad None, so that the optimizer skips it (AdamW's weight "
                    "decay moves a weight even when its gradient is zero)")
