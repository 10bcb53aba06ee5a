"""Lab 3, Part 1: a ring all-reduce from point-to-point messages (check_ring_all_reduce).
Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from __future__ import annotations

import torch

from gpulab.checks.harness import calls
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.distributed.errors import LaunchTimeout, RankError

RING_TIMEOUT_S = 20.0  # a ring on these sizes takes well under a second; a deadlock, forever



def _ring_inputs(n: int, op: str, world_size: int, dtype, seed: int) -> list[torch.Tensor]:
    """One input per rank, with small integer values (every sum is exact in any order).
    For op="sum", rank r's input is m * 2**r, with m in 1..7: an element holding c * m is the
    sum of the ranks whose bits are set in c, which names what a wrong ring left out."""
    g = torch.Generator().manual_seed(seed)
    if op == "sum":
        m = torch.randint(1, 8, (n,), generator=g).to(dtype)
        return [m * 2**r for r in range(world_size)]
    return [torch.randint(-99, 100, (n,), generator=g).to(dtype) for _ in range(world_size)]


def _ring_cases(world_size, sizes, ops, transposed, dtype, seed) -> list[dict]:
    cases = []
    for i, n in enumerate(sizes):
        for op in ops:
            inputs = _ring_inputs(n, op, world_size, dtype, seed + 31 * i + len(op))
            cases.append({"label": f"n={n}, op={op!r} on {world_size} ranks", "op": op,
                          "inputs": inputs, "transposed": False, "n": n})
    if transposed:  # a (4, 5) view of a (5, 4) tensor: neither contiguous nor 1-D
        inputs = [x.reshape(5, 4) for x in _ring_inputs(20, "sum", world_size, dtype, seed + 7)]
        cases.append({"label": f"a transposed (4, 5) tensor, op='sum' on {world_size} ranks",
                      "op": "sum", "inputs": inputs, "transposed": True, "n": 20})
    return cases


def _ring_hang(error: LaunchTimeout, logs) -> str:
    waiting = " ".join(error.waiting.values())
    if "waiting in send" in waiting or "waiting in recv" in waiting:
        return ("A ring in which every rank first sends (dist.send) and only then receives "
                "deadlocks: gloo's send waits until the neighbour posts the matching receive, "
                "and the neighbour is itself stuck in its own send. Post each step's send and "
                "receive together: dist.isend and dist.irecv, then wait() on both; or "
                "dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, "
                "...)]) and wait() on each request it returns.")
    return ("A rank that waits forever is waiting for a message its neighbour never sent: every "
            "rank must make the same 2 * (p - 1) steps, and a send and its receive must both be "
            "posted or both be skipped (with n < p some chunks are empty: skip them on both "
            "sides, or send them on both).")


def _ring_crash(error: RankError, logs) -> str | None:
    if error.exc_type or "SIGABRT" not in str(error):
        return None
    return ("gloo aborts a process that receives a message larger than the buffer it posted: "
            "the chunk a rank sends at a step must be the very chunk its right neighbour "
            "receives at that step (when n is not a multiple of p the chunks differ in size). "
            "Check each step's chunk indices.")


def check_ring_all_reduce(ring_all_reduce, world_sizes=(2, 3), sizes=(7, 1000),
                          ops=("sum", "max"), transposed: bool = False, dtype=torch.float32,
                          seed: int = 0) -> None:
    """ring_all_reduce(tensor, op) on real processes equals dist.all_reduce: for each world size,
    each size and each op ("sum", "max"); in place; from point-to-point messages only."""
    require_own_function(ring_all_reduce, "ring_all_reduce")
    for p in world_sizes:
        cases = _ring_cases(p, sizes, ops, transposed, dtype, seed + p)
        results = launch(lab3_ranks.ring_rank, p, ring_all_reduce, cases,
                         name="ring_all_reduce", case=f"{p} ranks", timeout_s=RING_TIMEOUT_S,
                         ship=(lab3_ranks,), explain_hang=_ring_hang, explain_crash=_ring_crash)
        for i, case in enumerate(cases):
            _grade_ring_case(case, [results[r][i] for r in range(p)], p)


def _grade_ring_case(case: dict, per_rank: list[dict], p: int) -> None:
    label = case["label"]
    for r, res in enumerate(per_rank):
        collectives = sorted({c for c in res["calls"] if c in calls.COLLECTIVES
                              and c != "barrier"})
        if collectives:
            raise AssertionError(
                f"ring_all_reduce ({label}) called dist.{', dist.'.join(collectives)} on rank "
                f"{r}: build the ring from point-to-point messages only (dist.isend and "
                "dist.irecv, dist.batch_isend_irecv, or dist.send and dist.recv). A collective "
                "inside it is the very thing you are building; it earns no points.")
        if res["borrowed"]:
            raise AssertionError(
                f"ring_all_reduce ({label}) ran {res['borrowed'][0]} on rank {r}: write the "
                "ring yourself, in the notebook; gpulab's version (lesson 04) earns no points.")
    inputs = [x.t() if case["transposed"] else x for x in case["inputs"]]
    stacked = torch.stack(inputs)
    want = stacked.sum(0) if case["op"] == "sum" else stacked.amax(0)
    for r, res in enumerate(per_rank):
        if not torch.equal(res["reference"], want):  # gloo itself: never expected to differ
            raise AssertionError(f"dist.all_reduce ({label}) gave a wrong answer on rank {r}: "
                                 "the machine's gloo is broken; report this.")
        got = res["got"]
        if torch.equal(got, want):
            continue
        raise AssertionError(f"ring_all_reduce ({label}): {_ring_mistake(case, inputs, res, r, p)}")


def _ring_mistake(case, inputs, res, r: int, p: int) -> str:
    """What is wrong with rank r's result, in words."""
    op, got = case["op"], res["got"]
    stacked = torch.stack(inputs)
    total, peak = stacked.sum(0), stacked.amax(0)
    want = total if op == "sum" else peak
    returned = res["returned"]
    layout = ""
    if case["transposed"]:
        layout = (" This tensor is a transposed view, not contiguous: tensor.reshape(-1) and "
                  "tensor.flatten() copy it, so the sum lands in the copy. Work on flat = "
                  "tensor.contiguous().view(-1), and end with tensor.copy_(flat.view_as(tensor)) "
                  "when flat is a copy.")
    if torch.equal(got, inputs[r]):
        if isinstance(returned, torch.Tensor) and torch.equal(returned, want):
            return (f"it returned the right result, but the tensor passed in still holds rank "
                    f"{r}'s own values: write the result into `tensor` itself (in place), as "
                    f"dist.all_reduce does.{layout}")
        return (f"the tensor passed in is unchanged on rank {r}: ring_all_reduce must leave "
                f"the result in it (in place).{layout}")
    if op == "sum" and torch.allclose(got * p, total):
        return (f"rank {r} holds the mean over the {p} ranks, not the sum. An all-reduce sums, "
                "as dist.all_reduce does by default (ReduceOp.SUM); data parallelism divides by "
                "the world size itself, later (Part 2).")
    if op == "max" and torch.equal(got, total):
        return (f"rank {r} holds the sum; for op='max', combine what arrives with your chunk by "
                "torch.maximum (elementwise), where op='sum' adds.")
    flat_got, chunks = got.reshape(-1), torch.arange(got.numel()).tensor_split(p)
    flat_want = want.reshape(-1)
    right = [k for k, idx in enumerate(chunks) if torch.equal(flat_got[idx], flat_want[idx])]
    bad = int(torch.nonzero(flat_got != flat_want)[0])
    k = next(k for k, idx in enumerate(chunks) if bad in idx.tolist())
    first, last = int(chunks[k][0]), int(chunks[k][-1])
    value, expected = flat_got[bad].item(), flat_want[bad].item()
    what = (f"element {bad} (in chunk {k}, elements {first}..{last}) is {value:g}, expected "
            f"{expected:g}")
    if op == "sum":
        c = value / inputs[0].reshape(-1)[bad].item()  # rank s contributes 2**s times m
        if c == int(c) and 0 < c < 2**p:
            ranks = [str(s) for s in range(p) if int(c) >> s & 1]
            what += (f": rank {ranks[0]}'s value alone" if len(ranks) == 1 else
                     f": the sum of ranks {', '.join(ranks)} only")
        elif c == int(c) and c >= 2**p:
            what += ": some rank's value was added more than once"
    if len(right) == 1:
        return (f"on rank {r}, {what}. Only chunk {right[0]} is complete: the reduce-scatter "
                "works, and the all-gather is missing or wrong. In p - 1 more steps each rank "
                "passes the finished chunks on around the ring, copying what arrives over its "
                "own chunk (not adding it): at step s rank r sends chunk (r + 1 - s) % p and "
                "receives chunk (r - s) % p.")
    return (f"on rank {r}, {what}. Check which chunk each step sends and receives: at step "
            "s = 0 .. p - 2 of the reduce-scatter, rank r sends chunk (r - s) % p to rank "
            "(r + 1) % p and combines the chunk it receives, (r - s - 1) % p, from rank "
            "(r - 1) % p into its own; after it, rank r holds the finished chunk (r + 1) % p.")
