"""Lab 3, Part 5: AdamW with its state sharded over the ranks, ZeRO stage 1 (check_sharded_adamw).

Every rank builds the same MLP, and takes a few steps: a backward on its share of the batch, then
the learner's optimizer.step(). Graded, in this order, each failure costing the whole part:
    - the code is the learner's (not gpulab's ZeroOneOptimizer, nor torch's
      ZeroRedundancyOptimizer), and step() moves data by collectives that reduce or gather;
    - after every step the ranks hold the same parameters (a missing gather shows here);
    - after the last step they equal one process's AdamW on the ranks' mean gradient, DDP's
      result (answer "lab3.sharded_adamw", computed outside the learner's kernel); shards
      stepped with their owner's gradient alone are named;
    - the tensors the optimizer keeps between steps (sharded_ranks.kept_tensors) hold at most
      1.5 x DDP's AdamW state / world_size + 32 bytes per parameter tensor;
    - each step sends no more than DDP's all-reduce of the gradients, 2 (p - 1) / p of their
      bytes, padding of world_size elements per parameter tensor allowed: calls.py records
      each collective's whole data (a reduce-scatter's input, an all-gather's output), and a
      rank sends (p - 1) / p of it in a ring, twice that for an all-reduce (ring_bytes).
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import torch

from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.checks.lab3 import sharded_ranks
from gpulab.checks.lab3.cases import MLP, make_case

TIMEOUT_S = 30.0  # three steps of a tiny model: seconds; a rank that waits: forever
HINT = 'gpulab.hint("lab3", "sharded_adamw")'
# The AdamW of each world size the lab grades on (the visible test: 2; the hidden one: 3).
SETTINGS = {2: {"seed": 0, "kwargs": {"lr": 0.01, "weight_decay": 0.1}},
            3: {"seed": 4, "kwargs": {"lr": 0.02, "betas": (0.8, 0.95), "weight_decay": 0.05}}}
STEPS = 3
ATOL = 1e-5  # float32 sums in another order move AdamW far less; a wrong step moves it ~lr
REDUCES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
           "reduce_scatter_single")
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast")
STATE_FACTOR, STATE_SLACK = 1.5, 32  # room for an fp32 copy of the shard; bytes per tensor


def sharded_case(world_size: int) -> dict:
    setting = SETTINGS[world_size]
    return make_case(f"an MLP on {world_size} ranks, AdamW({_kwargs(setting['kwargs'])})", MLP,
                     setting["seed"], world_size, setting["kwargs"], steps=STEPS)


def _kwargs(kwargs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def ddp_adamw(case: dict, world_size: int, grads=None) -> tuple[list[list], int]:
    """DDP's AdamW on one process: the parameters after each step, and the bytes of state
    torch's AdamW keeps on every rank. grads (optional): each step's gradient to use instead of
    the ranks' mean (the checker's guesses at a mistake)."""
    model = lab3_ranks.build_model(case["model"], case["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), **case["kwargs"])
    after = []
    for step, (x, y) in enumerate(case["batches"]):
        if grads is None:
            local = [_local_grads(model, x, y, r, world_size) for r in range(world_size)]
            mean = [sum(g) / world_size for g in zip(*local, strict=True)]
        else:
            mean = grads[step]
        for p, g in zip(model.parameters(), mean, strict=True):
            p.grad = g.clone()
        optimizer.step()
        after.append([p.detach().clone() for p in model.parameters()])
    kept, _ = sharded_ranks.kept_tensors(optimizer, list(model.parameters()))
    return after, sum(t["bytes"] for t in kept)


def _local_grads(model, x, y, rank: int, world_size: int) -> list[torch.Tensor]:
    shard = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def expected_sharded_adamw() -> dict:
    """ANSWERS["sharded_adamw"]: for each graded world size, DDP's parameters after the last
    step (one flat list) and the bytes of AdamW state DDP keeps on each rank."""
    answers = {}
    for world_size in SETTINGS:
        after, state_bytes = ddp_adamw(sharded_case(world_size), world_size)
        answers[str(world_size)] = {"params": _flat(after[-1]).tolist(),
                                    "state_bytes": state_bytes}
    return answers


def check_sharded_adamw(optimizer_class, world_size: int = 2, want: dict | None = None) -> None:
    """optimizer_class(model.parameters(), **adamw_kwargs), stepped on `world_size` ranks, keeps
    the ranks equal to DDP's AdamW with about 1/world_size of its state per rank, and moves one
    reduction of the gradients and one gathering of the parameters per step."""
    _require_own(optimizer_class)
    want = (want or expected_sharded_adamw())[str(world_size)]
    case = sharded_case(world_size)
    results = launch(sharded_ranks.sharded_rank, world_size, optimizer_class, case,
                     name="ShardedAdamW", case=f"{world_size} ranks", timeout_s=TIMEOUT_S,
                     ship=(lab3_ranks, sharded_ranks), explain_hang=_hang)
    label = case["label"]
    names = [n for n, _ in lab3_ranks.build_model(case["model"], 0).named_parameters()]
    shapes = [p.shape for p in results[0]["params"][0]]
    n_elements = sum(s.numel() for s in shapes)
    _refuse_borrowed_and_other_traffic(label, results)
    _same_on_every_rank(label, results, names)
    _equal_to_ddp(label, case, results, want["params"], names, world_size)
    _state_bytes(label, results, want["state_bytes"], n_elements, len(shapes), world_size)
    _traffic(label, results, n_elements, len(shapes), world_size)


def _require_own(optimizer_class) -> None:
    require_own_class(optimizer_class, "ShardedAdamW")
    for base in optimizer_class.__mro__:
        if (getattr(base, "__module__", "") or "").startswith("torch.distributed.optim"):
            raise AssertionError("ShardedAdamW extends torch's ZeroRedundancyOptimizer: shard "
                                 "the state yourself, with torch.distributed's collectives.")


def _hang(error, logs) -> str:
    return ("A rank waited for a collective that another rank never made. Every rank must make "
            "the same collectives, in the same order, with tensors of the same size on every "
            "rank (pad the last shard rather than send a shorter one), even a rank whose shard "
            f"is empty. {HINT} shows the plan.")


def _refuse_borrowed_and_other_traffic(label: str, results: list[dict]) -> None:
    for r, res in enumerate(results):
        if res["borrowed"]:
            raise AssertionError(f"ShardedAdamW ({label}) used {res['borrowed'][0]} on rank "
                                 f"{r}: write the sharding yourself, in the notebook.")
        other = sorted({c["call"] for c in res["calls"]} - {*REDUCES, *GATHERS, "barrier"})
        if other or res["sent"]:
            what = f"dist.{', dist.'.join(other)}" if other else "point-to-point messages"
            raise AssertionError(
                f"ShardedAdamW ({label}) used {what} in step() on rank {r}: a sharded optimizer "
                "needs two collectives, one that reduces the gradients (reduce_scatter_tensor, "
                "or a reduce to each owner) and one that gathers the parameters (all_gather_"
                f"into_tensor, or a broadcast from each owner). {HINT} shows the plan.")


def _same_on_every_rank(label: str, results: list[dict], names: list[str]) -> None:
    for step in range(STEPS):
        first = results[0]["params"][step]
        for r, res in enumerate(results[1:], start=1):
            where = _first_difference(res["params"][step], first, names)
            if where is None:
                continue
            gathered = sum(1 for c in res["calls"] if c["step"] == step and c["call"] in GATHERS)
            why = ("step() gathered nothing: each rank updated its own shard and kept the "
                   "others' parameters as they were. After the update, every rank must receive "
                   "every other shard (dist.all_gather_into_tensor of the shards, or a "
                   "broadcast from each shard's owner)." if gathered == 0 else
                   "some parameters were not written back from what the ranks gathered, or a "
                   "shard's owner differs between ranks: every rank must cut the same shards.")
            raise AssertionError(
                f"ShardedAdamW ({label}): after step {step}, rank {r} and rank 0 hold different "
                f"parameters ({where}): {why} {HINT} shows the plan.")


def _equal_to_ddp(label, case, results, want_params, names, world_size) -> None:
    got = _flat(results[0]["params"][-1])
    want = torch.tensor(want_params, dtype=got.dtype)
    if torch.allclose(got, want, rtol=0, atol=ATOL):
        return
    ddp, _ = ddp_adamw(case, world_size)  # each step, to name the first that differs
    step = next((s for s in range(STEPS) if _first_difference(
        results[0]["params"][s], ddp[s], names) is not None), STEPS - 1)
    where = _first_difference(results[0]["params"][step], ddp[step], names) or "somewhere"
    text = f"ShardedAdamW ({label}): after step {step}, the parameters differ from DDP's ({where})"
    if step == 0 and _owners_alone(case, results, world_size):
        raise AssertionError(
            f"{text}: each shard moved by its owner's gradient alone, the shards out of step "
            "with one another. Each rank's p.grad holds the gradient of its own share of the "
            "batch; the update needs their mean over the ranks. Reduce the gradients first "
            f"(a reduce-scatter leaves each rank the sum for its shard; divide by the world "
            f"size). {HINT} shows the plan.")
    if step > 0:
        raise AssertionError(
            f"{text}, though step 0 agreed: what your shard carries from step to step is off. "
            "AdamW's exp_avg, exp_avg_sq and step count live on, for your shard only, and the "
            "updated parameters must be written back into the model before the next forward. "
            f"{HINT} shows the plan.")
    raise AssertionError(
        f"{text}. The update is AdamW's on the mean of the ranks' gradients, with the "
        f"optimizer's lr, betas, eps and weight_decay. {HINT} shows the plan.")


def _owners_alone(case, results, world_size: int) -> bool:
    """Does step 0 on rank 0 match, element by element, some rank's AdamW step on its own
    gradient (and not the mean), for every element that differs from DDP's?"""
    first = dict(case, batches=case["batches"][:1])
    got = _flat(results[0]["params"][0])
    alone = [_flat(ddp_adamw(first, world_size, [res["grads"][0]])[0][0]) for res in results]
    mean = _flat(ddp_adamw(first, world_size)[0][0])
    differs = ~torch.isclose(got, mean, rtol=0, atol=ATOL)
    explained = torch.zeros_like(differs)
    for theirs in alone:
        explained |= torch.isclose(got, theirs, rtol=0, atol=ATOL)
    return bool(differs.any()) and bool(explained[differs].all())


def _flat(tensors: list) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _first_difference(got: list, want: list, names: list[str]) -> str | None:
    for name, a, b in zip(names, got, want, strict=True):
        bad = torch.nonzero(~torch.isclose(a, b, rtol=0, atol=ATOL))
        if len(bad):
            i = tuple(int(k) for k in bad[0])
            return f"{name}{list(i)} is {a[i].item():.6f}, expected {b[i].item():.6f}"
    return None


def _state_bytes(label, results, ddp_bytes: int, n_elements: int, n_tensors: int,
                 world_size: int) -> None:
    most = int(STATE_FACTOR * ddp_bytes / world_size) + STATE_SLACK * n_tensors
    for r, res in enumerate(results):
        total = sum(t["bytes"] for t in res["kept"])
        if total <= most:
            continue
        largest = ", ".join(f"{t['where']} ({t['numel']} elements, {t['bytes']} bytes)"
                            for t in res["kept"][:3])
        if res["kept"][0]["numel"] >= n_elements:
            whole = "One tensor kept is as large as the whole model. "
        elif total >= ddp_bytes:
            whole = "That is the whole model's state on every rank, as DDP keeps it. "
        else:  # whole tensors dealt out by turn: as even as the largest tensor allows
            whole = "That is more than one rank's share: the shares are uneven. "
        raise AssertionError(
            f"ShardedAdamW ({label}): the right parameters, but rank {r} keeps {total} bytes of "
            f"tensors between steps, where DDP's AdamW keeps {ddp_bytes} on every rank and a "
            f"sharded one at most {most} here ({STATE_FACTOR:g} x {ddp_bytes} / {world_size} + "
            f"{STATE_SLACK} per parameter tensor). {whole}The largest: {largest}. Keep "
            "exp_avg and exp_avg_sq (and any fp32 copy) for this rank's shard only, and make "
            f"whole-model buffers inside step(), not on self. {HINT} shows the plan.")


def ring_bytes(call: dict, world_size: int) -> float:
    """What one rank sends for a collective in a ring (or a pipelined tree): (p - 1) / p of its
    whole data, and twice that for an all-reduce, a reduce-scatter followed by an all-gather."""
    return (2 if call["call"] == "all_reduce" else 1) * (call["bytes"] or 0) * (
        world_size - 1) / world_size


def _traffic(label, results, n_elements: int, n_tensors: int, world_size: int) -> None:
    """Each step sends at most what DDP's all-reduce of the gradients sends, padding allowed."""
    padded = 4 * (n_elements + world_size * n_tensors)  # fp32
    most = round(2 * padded * (world_size - 1) / world_size)
    for r, res in enumerate(results):
        for step in range(STEPS):
            calls = [c for c in res["calls"] if c["step"] == step]
            sent = round(sum(ring_bytes(c, world_size) for c in calls))
            if sent <= most:
                continue
            by_kind = {}
            for c in calls:
                by_kind[c["call"]] = by_kind.get(c["call"], 0) + (c["bytes"] or 0)
            kinds = ", ".join(f"{kind} of {nbytes} bytes" for kind, nbytes in by_kind.items())
            why = ("An all-reduce sends twice what a reduce-scatter does, and each rank needs "
                   "only the sum of its own shard: reduce-scatter the gradients (or reduce each "
                   "to its owner), then gather the updated shards." if "all_reduce" in by_kind
                   else "Reduce the gradients once and gather the parameters once.")
            raise AssertionError(
                f"ShardedAdamW ({label}): the right parameters, but step {step} on rank {r} "
                f"made {kinds}: a rank sends {sent} bytes in a ring, where DDP's all-reduce of "
                f"the gradients sends {most} (2 (p - 1) / p of the parameters' bytes, padding "
                f"allowed). ZeRO-1 costs no more traffic than DDP. {why} {HINT} shows the plan.")
