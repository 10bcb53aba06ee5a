"""Checker for Lab 3, Part 2, and how every data-parallel wrapper of the lab is graded.

    check_simple_ddp(SimpleDDP)      Part 2  same start, averaged gradients (Part 3, with
                                     buckets and overlap, in fast_ddp.py)

Each rank builds the case's model from a seed of its own (so only a broadcast makes them equal),
wraps it in the learner's class, and takes a few optimizer steps on its shard of each batch; the
checker replays the same steps in one process on the whole batch and compares, step by step:
the parameters after construction (rank 0's, on every rank), the gradients after
finish_gradient_sync and the parameters after each step (identical on every rank, equal to
single-process training). When ranks hang or crash, the recorded collectives say where they
first disagreed.

The gradients follow torch DDP's rules, which a real model needs: a frozen parameter gets none;
one that no rank used keeps None (AdamW with weight decay, REAL's optimizer, would move it on a
zero); one used on some ranks gets the mean, zeros counted for the others. Buckets hold one dtype
each, and the wrapper's tensors live on the parameters' device: the ranks run the learner's code
with torch's default device set to "meta", so a tensor made without a device shows in the
collectives (calls.py records each one's dtype and device).
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import copy
import re

import torch
import torch.nn.functional as F

from gpulab.checks.harness.numbers import rel_err
from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.harness.ranks import PHASE_WORDS, launch
from gpulab.checks.harness.training import param_copies
from gpulab.checks.lab3 import ranks as lab3_ranks

DDP_TIMEOUT_S = 30.0  # a few steps of a tiny model: seconds; a rank that waits: forever
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


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- what went wrong


def _last_case(events: list[dict]) -> list[dict]:
    marks = [i for i, e in enumerate(events) if str(e.get("phase", "")).startswith("case: ")]
    return events[marks[-1]:] if marks else events


SAME_ORDER_HINT = (
    "Every rank must make the same all-reduces in the same order: launch bucket i only "
    "after buckets 0 .. i-1 have gone (in bucket order, not in the order they fill), and "
    "when a parameter got no gradient on a rank (a branch its forward pass skipped), it "
    "still goes on that rank, in its turn, with zeros for the missing gradient. Only a "
    "parameter that no rank used is skipped, and on every rank: one all-reduce of a "
    "per-parameter flag, 1 where this rank has a gradient, tells them which.")
DEVICE_HINT = (
    "Create every tensor the wrapper sends on its parameters' device: torch.zeros(n, "
    "dtype=p.dtype, device=p.device), torch.tensor(flags, device=p.device). The checker runs "
    "your wrapper with torch's default device set to 'meta' (a device without data, standing "
    "in for a GPU), so a tensor made without a device lands there. On a GPU, nccl refuses a "
    "buffer left on the CPU.")
DTYPE_HINT = (
    "A bucket is one flat tensor of one dtype: parameters of different dtypes (here bf16 "
    "beside float32) must not share a bucket. Pass make_buckets each parameter's kind, "
    "(p.dtype, p.device), and give each buffer its parameters' dtype.")


def describe_call(call: dict) -> str:
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
        said = {r: describe_call(seqs[r][k]) if seen[r] else "nothing (it made no more)"
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


def explain_ddp_crash(error, logs, device: str = "cpu") -> str | None:
    off_device = _off_device(logs, device)
    if off_device or re.search(r"\bmeta\b", error.traceback):
        return f"{off_device or 'A tensor of the wrapper was on another device.'} {DEVICE_HINT}"
    if "grad_dtype" in error.traceback:  # a float32 gradient assigned to a bf16 parameter
        return DTYPE_HINT
    gloo = not error.exc_type or any(word in error.traceback for word in (
        "gloo", "Connection reset", "Connection closed", "Broken pipe"))
    return _mismatch(logs) if gloo else None


def _off_device(logs, device: str) -> str | None:
    """The first collective of a tensor off the parameters' device (the CPU, or "cuda" where
    the case runs on GPUs with nccl), in words; None when every one was on it."""
    for r, events in sorted(logs.items()):
        for e in _last_case(events):
            if e.get("call") and e.get("device") not in (None, device):
                return (f"Rank {r} sent a tensor on the device '{e['device']}': "
                        f"{describe_call(e)}, while the parameters are on '{device}'.")
    return None


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
