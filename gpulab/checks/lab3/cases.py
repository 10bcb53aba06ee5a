"""Lab 3's data-parallel cases, and their replay in one process by torch DDP's rules.

    case = make_case("an MLP on 2 ranks", MLP, seed, 2, {})      # or real_case(seed, 2, {})
    replay = Replay(case, 2, follow=rank0_params)              # what every step must give

A case is plain data shipped to the ranks (lab3/ranks.py builds its model and optimizer from
it); Replay computes, in the checker's process, each rank's start, each rank's local gradients,
their mean by torch DDP's rules (frozen and unused-everywhere parameters: None; used on some
ranks: the mean with zeros) and the optimizer's step. simple_ddp.py and fast_ddp.py compare the
ranks' results with it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from gpulab.checks.harness.training import param_copies
from gpulab.checks.lab3 import ranks as lab3_ranks

SGD = {"name": "sgd", "lr": 0.5}  # plain SGD: any wrong gradient shows in the parameters
# AdamW with weight decay: a zero gradient where None was due still moves the weight.
ADAMW = {"name": "adamw", "lr": 0.01, "weight_decay": 0.1}
GRAD_RTOL = 1e-4  # float32 sums in another order: far closer than this
BF16_RTOL = 2e-2  # bf16 keeps 8 significant bits: a sum rounded once more is within this
BATCH = 12  # examples per step, split evenly over 2, 3 or 4 ranks
MLP = {"kind": "mlp", "n_features": 12, "n_classes": 5, "hidden": 16, "n_hidden": 2}
BRANCHY = {"kind": "branchy", "n_features": 12, "n_classes": 5, "hidden": 16}
REAL = {"kind": "real", "n_features": 12, "n_classes": 5, "hidden": 16}  # ranks.RealModel
REAL_LABEL = ("a model with a frozen layer, a bf16 layer, a branch used on rank 0 only and a "
              "layer no rank uses, trained with AdamW(weight_decay=0.1)")


# ----------------------------------------------------------------------------- the cases


def make_case(label, model, seed, world_size, kwargs, use_extra=None, steps=3,
              optimizer=SGD, device="cpu") -> dict:
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(BATCH, model["n_features"], generator=g),
                torch.randint(0, model["n_classes"], (BATCH,), generator=g))
               for _ in range(steps)]
    extra = None if use_extra is None else [bool(use_extra(r)) for r in range(world_size)]
    return {"label": label, "model": model, "seed": seed, "kwargs": kwargs,
            "optimizer": optimizer, "batches": batches, "use_extra": extra, "device": device}


def real_case(seed, world_size, kwargs, device="cpu") -> dict:
    """The case torch DDP's rules are about: frozen, unused and partly used parameters, mixed
    dtypes, and an optimizer that tells a zero gradient from none."""
    where = f"{world_size} GPUs with nccl" if device == "cuda" else f"{world_size} ranks"
    return make_case(f"{REAL_LABEL}, on {where}", REAL, seed, world_size, kwargs,
                     use_extra=lambda rank: rank == 0, optimizer=ADAMW, device=device)


class Replay:
    """The case's steps, replayed in this process by torch DDP's rules: each rank's own start;
    each rank's local gradients; their mean, where a rank without a gradient adds zeros, and
    None where no rank has one (frozen parameters, and those no rank used); and the optimizer's
    step on that mean, from rank 0's start. With every parameter used on every rank, that is
    single-process training on the whole batch.

    follow: the parameters rank 0 reported after each step. Each step is then replayed from
    the ranks' own parameters, so that bf16 rounding in one step (the ranks sum in another
    order) does not grow into a difference in the next; each step is still checked whole."""

    def __init__(self, case: dict, world_size: int, follow=None):
        first = lab3_ranks.build_model(case["model"], 0)
        self.names = [n for n, _ in first.named_parameters()]
        self.frozen = [not p.requires_grad for p in first.parameters()]
        self.dtypes = [p.dtype for p in first.parameters()]
        self.starts = [param_copies(lab3_ranks.build_model(case["model"],
                                                      lab3_ranks.rank_seed(case["seed"], r)))
                       for r in range(world_size)]
        model = lab3_ranks.build_model(case["model"], lab3_ranks.rank_seed(case["seed"], 0))
        optimizer = lab3_ranks.make_optimizer(case["optimizer"], model.parameters())
        self.local, self.grads, self.params = [], [], []
        for x, y in case["batches"]:
            local = []
            for r in range(world_size):
                shard = slice(r * len(x) // world_size, (r + 1) * len(x) // world_size)
                extra = {} if case["use_extra"] is None else {"use_extra": case["use_extra"][r]}
                replica = copy.deepcopy(model)
                F.cross_entropy(replica(x[shard], **extra), y[shard]).backward()
                local.append([None if p.grad is None else p.grad for p in replica.parameters()])
            mean = [_mean(grads, world_size) for grads in zip(*local, strict=True)]
            for p, g in zip(model.parameters(), mean, strict=True):
                p.grad = g
            optimizer.step()
            self.local.append(local)
            self.grads.append(mean)
            self.params.append(param_copies(model))
            if follow is not None and len(follow) >= len(self.params):
                _load(model, follow[len(self.params) - 1])

    def rtol(self, i: int) -> float:
        return BF16_RTOL if self.dtypes[i] == torch.bfloat16 else GRAD_RTOL


def _load(model, params) -> None:
    """The ranks' parameters into `model`, where they fit (a learner's wrapper may have broken
    them: then the replay goes on from its own, and the checks say what differs)."""
    with torch.no_grad():
        for p, theirs in zip(model.parameters(), params, strict=False):
            if isinstance(theirs, torch.Tensor) and theirs.shape == p.shape:
                p.copy_(theirs)


def _mean(grads, world_size: int):
    """The all-reduced mean of one parameter's gradients (None: this rank had none), in the
    parameter's dtype; None when no rank had one."""
    have = [g for g in grads if g is not None]
    if not have:
        return None
    return (sum(g.float() for g in have) / world_size).to(have[0].dtype)
