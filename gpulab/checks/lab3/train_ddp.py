"""Checker for Lab 3, Part 4: data-parallel training with a DistributedSampler, on real processes.

    check_train_ddp(train_ddp)   Part 4  equal to the single-process baseline on 2 and 4 ranks

Each rank runs train_ddp(rank, world_size, ddp_class, dataset, epochs=..., global_batch_size=...,
lr=..., seed=...) with ddp_class = lab3_ranks.StandInDDP: torch's own DDP, which notes what the
loop does with it. So Part 4 is graded on the data and the loop alone, and a mistake in Parts 2
or 3 costs nothing here. The checker trains the same MLP in one process with the same global
batches, made as DistributedSampler makes them: epoch e's order is torch.randperm(n) with a
generator seeded seed + e, rank r takes its entries r, r + p, r + 2p, ..., and so at each step
the ranks' batches together are the next global_batch_size entries of that order. The mean over
the ranks of each step's loss, and the final parameters, must match.
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.data import Blobs
from gpulab.models import MLP

TRAIN_TIMEOUT_S = 60.0  # two epochs of a tiny MLP: seconds
HIDDEN = 32  # train_ddp's model: MLP(dataset.n_features, dataset.n_classes, hidden=32)
RTOL = 1e-4  # float32 sums in another order


def make_dataset(seed: int = 0, n_samples: int = 192) -> Blobs:
    """Part 4's data: 4 classes of 8-feature points, hard enough that the loss keeps moving."""
    return Blobs(n_samples=n_samples, n_classes=4, n_features=8, spread=2.0, seed=seed)


def baseline(dataset, epochs: int, global_batch_size: int, lr: float, seed: int,
             epoch_seed=lambda seed, epoch: seed + epoch, shuffle: bool = True):
    """Single-process training on the global batches: (the loss of every step, final state).
    epoch_seed and shuffle give the orders of the known mistakes (see _ORDERS)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(dataset.n_features, dataset.n_classes, hidden=HIDDEN)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    n, losses = len(dataset), []
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(epoch_seed(seed, epoch))
        order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
        for step in range(n // global_batch_size):
            idx = order[step * global_batch_size:(step + 1) * global_batch_size]
            loss = F.cross_entropy(model(dataset.x[idx]), dataset.y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


_ORDERS = (  # (baseline options of a known mistake, what to say)
    ({"epoch_seed": lambda seed, epoch: seed},
     "Every epoch went through the data in the same order: call sampler.set_epoch(epoch) at "
     "the start of each epoch. DistributedSampler shuffles with seed + epoch, and its epoch "
     "stays 0 until you set it."),
    ({"epoch_seed": lambda seed, epoch: epoch},
     "The shuffle ignored `seed`: pass it on, DistributedSampler(dataset, "
     "num_replicas=world_size, rank=rank, shuffle=True, seed=seed)."),
    ({"epoch_seed": lambda seed, epoch: 0},
     "Every epoch went through the data in the same order, and the shuffle ignored `seed`: "
     "DistributedSampler(..., seed=seed), and sampler.set_epoch(epoch) at each epoch's start."),
    ({"shuffle": False},
     "The data was not shuffled: DistributedSampler(..., shuffle=True)."),
)


def check_train_ddp(train_ddp, world_sizes=(2, 4), epochs: int = 2, global_batch_size: int = 32,
                    lr: float = 0.1, seed: int = 0) -> None:
    """train_ddp on each world size: every rank's loop used the wrapper it was given, batches of
    global_batch_size // world_size, one finish_gradient_sync between backward and the step;
    the mean over the ranks of each step's loss and the final parameters equal single-process
    training with the same global batches."""
    require_own_function(train_ddp, "train_ddp")
    dataset = make_dataset(seed)
    kwargs = {"epochs": epochs, "global_batch_size": global_batch_size, "lr": lr, "seed": seed}
    want_losses, want_state = baseline(dataset, **kwargs)
    for p in world_sizes:
        case = f"{p} ranks, {len(dataset)} examples, {epochs} epochs, global_batch_size=" \
               f"{global_batch_size}, seed={seed}"
        results = launch(lab3_ranks.train_rank, p, train_ddp, dataset, kwargs, name="train_ddp",
                         case=case, timeout_s=TRAIN_TIMEOUT_S, ship=(lab3_ranks,))
        for r, res in enumerate(results):
            _check_loop(res["notes"], res["set_epoch"], r, p, case, len(dataset), **kwargs)
        runs = [_unpack(res["result"], r, case, want_state) for r, res in enumerate(results)]
        _check_run(runs, want_losses, want_state, case, dataset, p, kwargs)


def _check_loop(notes, set_epoch, r, p, case, n, epochs, global_batch_size, lr, seed) -> None:
    where = f"train_ddp ({case}), rank {r}"
    b = global_batch_size // p
    if not notes["made"]:
        raise AssertionError(f"{where} never built the wrapper it was given: wrap the model with "
                             "ddp = ddp_class(model), and train through ddp(x).")
    sizes = notes["batch_sizes"]
    if sizes and set(sizes) != {b}:
        raise AssertionError(
            f"{where}: its batches had {sorted(set(sizes))} examples. The global batch of "
            f"{global_batch_size} is split over {p} ranks: each rank's DataLoader takes "
            f"batch_size = global_batch_size // world_size = {b}.")
    steps = epochs * (n // global_batch_size)
    if len(sizes) != steps:
        raise AssertionError(
            f"{where} ran {len(sizes)} steps; {epochs} epochs of {n} examples in global batches "
            f"of {global_batch_size} are {steps}. Each rank must see only its 1/{p} of the data: "
            "DataLoader(dataset, batch_size=..., sampler=DistributedSampler(dataset, "
            "num_replicas=world_size, rank=rank, shuffle=True, seed=seed)).")
    if notes["finished"] != len(sizes):
        raise AssertionError(
            f"{where} called finish_gradient_sync {notes['finished']} times in {len(sizes)} "
            "steps: once per step, after loss.backward() and before optimizer.step().")
    if notes["stepped_first"]:
        raise AssertionError(
            f"{where}: the parameters changed between the forward pass and "
            "finish_gradient_sync: optimizer.step() must come after finish_gradient_sync, which "
            "is what makes the gradients the mean over the ranks.")


def _unpack(result, r, case, want_state):
    """The (losses, state) a rank returned, as a list of floats and {key: tensor}."""
    where = f"train_ddp ({case}) on rank {r}"
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise AssertionError(f"{where} returned {_short(result)}: return (losses, state), the "
                             "list of this rank's losses and model.state_dict().")
    losses, state = result
    if isinstance(losses, torch.Tensor):
        losses = losses.reshape(-1).tolist()
    try:
        losses = [float(v) for v in losses]
    except (TypeError, ValueError):
        raise AssertionError(f"{where}: the losses are {_short(losses)}; return a list of "
                             "numbers, one per step.") from None
    if not isinstance(state, dict):
        raise AssertionError(f"{where}: the state is {_short(state)}; return model.state_dict()")
    found = {}
    for key in want_state:
        match = [v for k, v in state.items() if k == key or k.endswith("." + key)]
        if len(match) != 1 or not isinstance(match[0], torch.Tensor):
            raise AssertionError(f"{where}: the state has no tensor {key!r} (its keys: "
                                 f"{list(state)[:6]}); return the MLP's state_dict().")
        found[key] = match[0].float()
    return losses, found


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def _check_run(runs, want_losses, want_state, case, dataset, p, kwargs) -> None:
    counts = {len(losses) for losses, _ in runs}
    if counts != {len(want_losses)}:
        raise AssertionError(f"train_ddp ({case}) returned {sorted(counts)} losses per rank; "
                             f"it ran {len(want_losses)} steps: one loss per step.")
    mean = [sum(v) / p for v in zip(*(losses for losses, _ in runs), strict=True)]
    bad = next((i for i, (g, w) in enumerate(zip(mean, want_losses, strict=True))
                if not math.isclose(g, w, rel_tol=RTOL, abs_tol=1e-6)), None)
    if bad is not None:
        for options, hint in _ORDERS:
            alt, _ = baseline(dataset, **kwargs, **options)
            if all(math.isclose(g, w, rel_tol=RTOL, abs_tol=1e-6)
                   for g, w in zip(mean, alt, strict=True)):
                raise AssertionError(f"train_ddp ({case}): {hint}")
        steps = len(dataset) // kwargs["global_batch_size"]
        raise AssertionError(
            f"train_ddp ({case}): at step {bad} (epoch {bad // steps}) the mean of the ranks' "
            f"losses is {mean[bad]:.5f}; single-process training on the same global batches "
            f"has {want_losses[bad]:.5f}. Build the model with torch.manual_seed(seed) then "
            f"MLP(dataset.n_features, dataset.n_classes, hidden={HIDDEN}); plain SGD(lr); "
            "each step: zero_grad, loss = F.cross_entropy(ddp(x), y), backward, "
            "finish_gradient_sync, step; return each step's loss.")
    for r, (_, state) in enumerate(runs):
        for key, want in want_state.items():
            if not torch.allclose(state[key], want, rtol=RTOL, atol=1e-6):
                raise AssertionError(
                    f"train_ddp ({case}): after training, {key} on rank {r} differs from "
                    "single-process training, though the losses matched: return the trained "
                    "model's state_dict(), after the last step.")
