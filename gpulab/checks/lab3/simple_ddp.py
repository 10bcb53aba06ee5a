"""Checker for Lab 3, Part 2, and how every data-parallel wrapper of the lab is graded.

    check_simple_ddp(SimpleDDP)      Part 2  same start, averaged gradients (Part 3, with
                                     buckets and overlap, in fast_ddp.py)

Each rank builds the case's model from a seed of its own (so only a broadcast makes them equal),
wraps it in the learner's class, and takes a few optimizer steps on its shard of each batch; the
checker replays the same steps in one process on the whole batch and compares, step by step:
the parameters after construction (rank 0's, on every rank), the gradients after
finish_gradient_sync and the parameters after each step (identical on every rank, equal to
single-process training). When ranks hang or crash, the recorded collectives say where they
first disagreed (explain.py). The cases and their replay in one process are cases.py.

The gradients follow torch DDP's rules, which a real model needs: a frozen parameter gets none;
one that no rank used keeps None (AdamW with weight decay, REAL's optimizer, would move it on a
zero); one used on some ranks gets the mean, zeros counted for the others. Buckets hold one dtype
each, and the wrapper's tensors live on the parameters' device: the ranks run the learner's code
with torch's default device set to "meta", so a tensor made without a device shows in the
collectives (calls.py records each one's dtype and device).
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import torch

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.checks.lab3.cases import BF16_RTOL, GRAD_RTOL, MLP, Replay, make_case, real_case
from gpulab.checks.lab3.explain import (
    DTYPE_HINT,
    explain_ddp_crash,
    explain_ddp_hang,
    refuse_borrowed,
)

DDP_TIMEOUT_S = 30.0  # a few steps of a tiny model: seconds; a rank that waits: forever


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def check_start(name: str, label: str, results, replay: Replay) -> None:
    want = replay.starts[0]
    for r, res in enumerate(results):
        if _equal(res["start"], want):
            continue
        if r and _equal(res["start"], replay.starts[r]):
            raise AssertionError(
                f"{name} ({label}): after {name}(model) rank {r} still holds its own random "
                "initial parameters. Each rank built its model from its own seed; the wrapper "
                "must start every rank from rank 0's: in __init__, dist.broadcast(p.data, "
                "src=0) for every parameter, on every rank.")
        mean = [sum(ps) / len(replay.starts) for ps in zip(*replay.starts, strict=True)]
        if rel_err(res["start"], mean) < GRAD_RTOL:
            raise AssertionError(
                f"{name} ({label}): the ranks start from the mean of their initial parameters: "
                "copy rank 0's with dist.broadcast(p.data, src=0), do not average them.")
        raise AssertionError(
            f"{name} ({label}): after {name}(model), rank {r}'s parameters are not rank 0's "
            "initial ones. Broadcast each parameter from rank 0 (src=0), in place, and change "
            "nothing else in __init__.")


def check_steps(name: str, label: str, results, replay: Replay, world_size: int) -> None:
    for step in range(len(replay.grads)):
        want = replay.grads[step]
        for r, res in enumerate(results):
            where = f"{name} ({label}), step {step}, rank {r}"
            got = res["grads"][step]
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                if w is None and g is not None:
                    raise AssertionError(f"{where}: {_none_due(replay, i)}")
                if w is not None and g is None:
                    raise AssertionError(f"{where}: {_missing(replay, step, r, i)}")
            for rtol, group in _by_tolerance(replay, want):
                if rel_err([got[i] for i in group], [want[i] for i in group]) > rtol:
                    raise AssertionError(
                        f"{where}: {_grad_mistake(got, replay, step, r, world_size, group)}")
        for r, res in enumerate(results[1:], start=1):
            same = [a is None and b is None or a is not None and b is not None
                    and torch.equal(a, b) for a, b in zip(res["grads"][step],
                                                          results[0]["grads"][step],
                                                          strict=True)]
            if not all(same):
                bad = replay.names[same.index(False)]
                raise AssertionError(
                    f"{name} ({label}), step {step}: the gradient of {bad} differs between "
                    f"rank 0 and rank {r} after finish_gradient_sync. Every rank must end with "
                    "the same all-reduced gradient, bit for bit.")
        for r, res in enumerate(results):
            if not _equal(res["params"][step], results[0]["params"][step]):
                raise AssertionError(
                    f"{name} ({label}): after step {step} the parameters of rank {r} differ from "
                    "rank 0's: the ranks drifted apart. Same start and same gradients give the "
                    "same parameters.")
        got, want = results[0]["params"][step], replay.params[step]
        for rtol, group in _by_tolerance(replay, want):
            if rel_err([got[i] for i in group], [want[i] for i in group]) > rtol:
                raise AssertionError(
                    f"{name} ({label}): after step {step} the parameters differ from "
                    "single-process training on the whole batch, although the gradients "
                    "matched: does the wrapper change the parameters outside __init__?")


def _by_tolerance(replay: Replay, tensors) -> list[tuple[float, list[int]]]:
    """The indices of the tensors that are not None, grouped by their dtype's tolerance."""
    groups: dict[float, list[int]] = {}
    for i, t in enumerate(tensors):
        if t is not None:
            groups.setdefault(replay.rtol(i), []).append(i)
    return sorted(groups.items())


def _none_due(replay: Replay, i: int) -> str:
    """What to say of a gradient where torch's DDP leaves None."""
    param = replay.names[i]
    if replay.frozen[i]:
        return (f"{param} is frozen (requires_grad=False), yet it has a gradient after "
                "finish_gradient_sync. Leave frozen parameters alone, as torch's DDP does: no "
                "gradient, no all-reduce (sync only the parameters with p.requires_grad).")
    return (f"{param} has a gradient after finish_gradient_sync, but no rank used it in this "
            "step (no rank's forward ran its layer). Leave its .grad None, as torch's DDP "
            "does, so that the optimizer skips it: a zero gradient is not the same, AdamW's "
            "weight decay still moves the weight. One all-reduce of a flag per parameter (1 "
            "where this rank has a gradient) tells the ranks which ones no rank used: 0.")


def _missing(replay: Replay, step: int, r: int, i: int) -> str:
    param = replay.names[i]
    users = [k for k, grads in enumerate(replay.local[step]) if grads[i] is not None]
    if r not in users:
        return (f"{param} has no gradient after finish_gradient_sync. This rank did not use it, "
                f"but rank {users[0]} did: every rank must end with the mean over the ranks, "
                "zeros counted for the ranks that did not use it (as torch's DDP does), so the "
                "copies stay equal.")
    return (f"after finish_gradient_sync, {param} has no gradient. finish_gradient_sync must "
            "leave in p.grad the mean of the ranks' gradients, for every parameter that some "
            "rank used.")


def _grad_mistake(got, replay: Replay, step: int, r: int, world_size: int, group) -> str:
    got = [got[i] for i in group]
    want = [replay.grads[step][i] for i in group]
    if rel_err(got, [w * world_size for w in want]) <= GRAD_RTOL:
        return (f"the gradients are {world_size} times too big: they are the sum over the "
                f"ranks. Divide by the world size ({world_size}): single-process training on "
                "the whole batch has the mean of the ranks' gradients (each rank's loss is the "
                "mean over its shard, and the shards are the same size).")
    if rel_err(got, [w / world_size for w in want]) <= GRAD_RTOL:
        return (f"the gradients are {world_size} times too small: divide the sum by the world "
                "size once.")
    local = [replay.local[step][r][i] for i in group]
    local = [torch.zeros_like(w) if g is None else g for g, w in zip(local, want, strict=True)]
    if rel_err(got, local) <= GRAD_RTOL or rel_err(
            got, [g / world_size for g in local]) <= GRAD_RTOL:
        return ("the gradients are this rank's own (those of its shard alone, maybe divided by "
                "the world size): they never went through the all-reduce, or its result never "
                "reached p.grad.")
    err = rel_err(got, want)
    lost_bits = replay.dtypes[group[0]] == torch.float32 and torch.bfloat16 in replay.dtypes
    if lost_bits and err < BF16_RTOL:
        return (f"the float32 gradients differ from the mean by {err:.2%} of the largest "
                f"entry, about what bf16 rounding costs: they went through a bf16 buffer. "
                f"{DTYPE_HINT}")
    return (f"after finish_gradient_sync the gradients differ from single-process training on "
            f"the whole batch by {err:.1%} of the largest entry. p.grad must hold the sum over "
            "the ranks divided by the world size.")


def check_simple_ddp(SimpleDDP, world_sizes=(2,), seed: int = 0) -> None:
    """SimpleDDP(model): every rank starts from rank 0's parameters; after
    finish_gradient_sync, every rank's gradients are the mean over the ranks, by torch DDP's
    rules (frozen parameters and those no rank used keep None; one used on some ranks gets the
    mean with zeros); three optimizer steps match single-process training on the whole batch,
    identical on every rank. On each world size: an MLP with SGD, and REAL with AdamW."""
    require_own_class(SimpleDDP, "SimpleDDP")
    for p in world_sizes:
        cases = [make_case(f"an MLP on {p} ranks", MLP, seed + p, p, {}),
                 real_case(seed + p, p, {})]
        results = launch(lab3_ranks.ddp_rank, p, SimpleDDP, cases, name="SimpleDDP",
                         case=f"{p} ranks", timeout_s=DDP_TIMEOUT_S, ship=(lab3_ranks,),
                         explain_hang=explain_ddp_hang, explain_crash=explain_ddp_crash)
        for i, case in enumerate(cases):
            per_rank = [results[r][i] for r in range(p)]
            refuse_borrowed("SimpleDDP", per_rank)
            replay = Replay(case, p, follow=per_rank[0]["params"])
            check_start("SimpleDDP", case["label"], per_rank, replay)
            check_steps("SimpleDDP", case["label"], per_rank, replay, p)
