"""Checker for Lab 3, Part 2, and how every data-parallel wrapper of the lab is graded.

    check_simple_ddp(SimpleDDP)      Part 2  same start, averaged gradients (Part 3, with
                                     buckets and overlap, in fast_ddp.py)

Each rank builds the case's model from a seed of its own (so only a broadcast makes them equal),
wraps it in the learner's class, and takes a few SGD steps on its shard of each batch; the
checker replays the same steps in one process on the whole batch and compares, step by step:
the parameters after construction (rank 0's, on every rank), the gradients after
finish_gradient_sync and the parameters after each step (identical on every rank, equal to
single-process training). When ranks hang or crash, the recorded collectives say where they
first disagreed.
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.harness.ranks import PHASE_WORDS, launch
from gpulab.checks.harness.training import param_copies
from gpulab.checks.lab3 import ranks as lab3_ranks

DDP_TIMEOUT_S = 30.0  # a few steps of a tiny model: seconds; a rank that waits: forever
LR = 0.5  # plain SGD: any wrong gradient shows in the parameters
GRAD_RTOL = 1e-4  # float32 sums in another order: far closer than this
BATCH = 12  # examples per step, split evenly over 2, 3 or 4 ranks
MLP = {"kind": "mlp", "n_features": 12, "n_classes": 5, "hidden": 16, "n_hidden": 2}
BRANCHY = {"kind": "branchy", "n_features": 12, "n_classes": 5, "hidden": 16}


# ----------------------------------------------------------------------------- the cases


def make_case(label, model, seed, world_size, kwargs, use_extra=None, steps=3) -> dict:
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(BATCH, model["n_features"], generator=g),
                torch.randint(0, model["n_classes"], (BATCH,), generator=g))
               for _ in range(steps)]
    extra = None if use_extra is None else [bool(use_extra(r)) for r in range(world_size)]
    return {"label": label, "model": model, "seed": seed, "kwargs": kwargs, "lr": LR,
            "batches": batches, "use_extra": extra}


class Replay:
    """The case's steps, replayed in this process: each rank's own start, each rank's local
    gradients, and their mean (missing gradients count as zero), step after step from rank 0's
    start. With every parameter used on every rank, that mean is the gradient of single-process
    training on the whole batch."""

    def __init__(self, case: dict, world_size: int):
        self.names = [n for n, _ in lab3_ranks.build_model(case["model"], 0).named_parameters()]
        self.starts = [param_copies(lab3_ranks.build_model(case["model"],
                                                      lab3_ranks.rank_seed(case["seed"], r)))
                       for r in range(world_size)]
        model = lab3_ranks.build_model(case["model"], lab3_ranks.rank_seed(case["seed"], 0))
        self.local, self.grads, self.params = [], [], []
        for x, y in case["batches"]:
            local = []
            for r in range(world_size):
                shard = slice(r * len(x) // world_size, (r + 1) * len(x) // world_size)
                extra = {} if case["use_extra"] is None else {"use_extra": case["use_extra"][r]}
                replica = copy.deepcopy(model)
                F.cross_entropy(replica(x[shard], **extra), y[shard]).backward()
                local.append([torch.zeros_like(p) if p.grad is None else p.grad
                              for p in replica.parameters()])
            mean = [sum(g) / world_size for g in zip(*local, strict=True)]
            with torch.no_grad():
                for p, g in zip(model.parameters(), mean, strict=True):
                    p -= case["lr"] * g
            self.local.append(local)
            self.grads.append(mean)
            self.params.append(param_copies(model))


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- what went wrong


def _last_case(events: list[dict]) -> list[dict]:
    marks = [i for i, e in enumerate(events) if str(e.get("phase", "")).startswith("case: ")]
    return events[marks[-1]:] if marks else events


SAME_ORDER_HINT = (
    "Every rank must make the same all-reduces in the same order: launch bucket i only "
    "after buckets 0 .. i-1 have gone (in bucket order, not in the order they fill), and "
    "when a parameter got no gradient on a rank (a branch its forward pass skipped), its "
    "bucket still goes, in its turn, from finish_gradient_sync, with zeros for the "
    "missing gradients.")


def _describe(call: dict) -> str:
    return (f"{call['call']} of {call['numel']} elements "
            f"{PHASE_WORDS.get(call['phase'], call['phase'])}")


def _mismatch(logs) -> str | None:
    """Where the ranks' collectives first differ, in words; None when they agree."""
    seqs = {r: [e for e in _last_case(events) if e.get("call") and e["call"] != "barrier"]
            for r, events in logs.items()}
    longest = max((len(s) for s in seqs.values()), default=0)
    for k in range(longest):
        seen = {r: (s[k]["call"], s[k]["numel"]) if k < len(s) else None
                for r, s in seqs.items()}
        if len(set(seen.values())) <= 1:
            continue
        a = next(r for r, v in sorted(seen.items()) if v is not None)
        b = next(r for r, v in sorted(seen.items()) if v != seen[a])
        said = {r: _describe(seqs[r][k]) if seen[r] else "nothing (it made no more)"
                for r in (a, b)}
        hint = SAME_ORDER_HINT
        if any(seen[r] and seqs[r][k]["phase"] == "construct" for r in (a, b)):
            hint = ("Every rank must make the same broadcasts in __init__, in the same order: "
                    "dist.broadcast(p.data, src=0) for each parameter, on every rank (not "
                    "under `if rank == 0`): rank 0 sends, the others receive.")
        return (f"The ranks' collectives differ: call {k + 1} is {said[a]} on rank {a}, but "
                f"{said[b]} on rank {b}. Collectives are matched by their order, so gloo then "
                f"sums unrelated buffers, aborts, or waits forever. {hint}")
    return None


def explain_ddp_hang(error, logs) -> str:
    return _mismatch(logs) or (
        "A rank waited for a collective that another rank never made, or for a handle that "
        f"never completes. {SAME_ORDER_HINT}")


def explain_ddp_crash(error, logs) -> str | None:
    gloo = not error.exc_type or any(word in error.traceback for word in (
        "gloo", "Connection reset", "Connection closed", "Broken pipe"))
    return _mismatch(logs) if gloo else None


def refuse_borrowed(name: str, results: list[dict]) -> None:
    for r, res in enumerate(results):
        if res["torch_ddp"]:
            raise AssertionError(f"{name} wraps torch's DistributedDataParallel (rank {r}): "
                                 "build the wrapper yourself from torch.distributed's "
                                 "collectives; torch's DDP earns no points here.")
        if res["borrowed"]:
            raise AssertionError(f"{name} ran {res['borrowed'][0]} on rank {r}: write the "
                                 "wrapper yourself, in the notebook.")


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
            got = res["grads"][step]
            missing = [n for n, g, w in zip(replay.names, got, want, strict=True)
                       if g is None and bool(w.any())]
            if missing:
                raise AssertionError(
                    f"{name} ({label}): after finish_gradient_sync in step {step}, {missing[0]} "
                    f"has no gradient on rank {r}. finish_gradient_sync must leave in p.grad "
                    "the mean of the ranks' gradients, for every parameter.")
            got = [torch.zeros_like(w) if g is None else g for g, w in zip(got, want,
                                                                           strict=True)]
            if rel_err(got, want) > GRAD_RTOL:
                raise AssertionError(f"{name} ({label}), step {step}, rank {r}: "
                                     f"{_grad_mistake(got, replay, step, r, world_size)}")
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
        if rel_err(results[0]["params"][step], replay.params[step]) > GRAD_RTOL:
            raise AssertionError(
                f"{name} ({label}): after step {step} the parameters differ from single-process "
                "training on the whole batch, although the gradients matched: does the wrapper "
                "change the parameters outside __init__?")


def _grad_mistake(got, replay: Replay, step: int, r: int, world_size: int) -> str:
    want = replay.grads[step]
    if rel_err(got, [w * world_size for w in want]) <= GRAD_RTOL:
        return (f"the gradients are {world_size} times too big: they are the sum over the "
                f"ranks. Divide by the world size ({world_size}): single-process training on "
                "the whole batch has the mean of the ranks' gradients (each rank's loss is the "
                "mean over its shard, and the shards are the same size).")
    if rel_err(got, [w / world_size for w in want]) <= GRAD_RTOL:
        return (f"the gradients are {world_size} times too small: divide the sum by the world "
                "size once.")
    local = replay.local[step][r]
    if rel_err(got, local) <= GRAD_RTOL or rel_err(
            got, [g / world_size for g in local]) <= GRAD_RTOL:
        return ("the gradients are this rank's own (those of its shard alone, maybe divided by "
                "the world size): they never went through the all-reduce, or its result never "
                "reached p.grad.")
    err = rel_err(got, want)
    return (f"after finish_gradient_sync the gradients differ from single-process training on "
            f"the whole batch by {err:.1%} of the largest entry. p.grad must hold the sum over "
            "the ranks divided by the world size.")



def check_simple_ddp(SimpleDDP, world_sizes=(2,), seed: int = 0) -> None:
    """SimpleDDP(model): every rank starts from rank 0's parameters; after
    finish_gradient_sync, every rank's gradients are the mean over the ranks; three SGD steps
    match single-process training on the whole batch, identical on every rank."""
    require_own_class(SimpleDDP, "SimpleDDP")
    for p in world_sizes:
        case = make_case(f"an MLP on {p} ranks", MLP, seed + p, p, {})
        results = launch(lab3_ranks.ddp_rank, p, SimpleDDP, [case], name="SimpleDDP",
                         case=case["label"], timeout_s=DDP_TIMEOUT_S, ship=(lab3_ranks,),
                         explain_hang=explain_ddp_hang, explain_crash=explain_ddp_crash)
        per_rank = [results[r][0] for r in range(p)]
        refuse_borrowed("SimpleDDP", per_rank)
        replay = Replay(case, p)
        check_start("SimpleDDP", case["label"], per_rank, replay)
        check_steps("SimpleDDP", case["label"], per_rank, replay, p)
