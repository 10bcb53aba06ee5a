"""Lab 3, Part 1: a ring all-reduce from point-to-point messages (check_ring_all_reduce).

Graded: the result equals dist.all_reduce's on every rank, in place, with no collective inside;
then the ring's traffic, counted message by message on each rank (harness/calls.py): at most
2 (p - 1) messages, and at most 2 (p - 1) ceil(n / p) elements in all, what a reduce-scatter and
an all-gather of one chunk per step send. Whole tensors sent to every rank, or chunks cut into
many small messages, give the right numbers the wrong way and fail with their counts.
Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from __future__ import annotations

import torch

from gpulab.checks.harness import calls
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.distributed.runtime.errors import LaunchTimeout, RankError

RING_TIMEOUT_S = 20.0  # a ring on these sizes takes well under a second; a deadlock, forever
HINT = 'gpulab.hint("lab3", "ring_all_reduce")'

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
    # The rank that got too large a message aborts (SIGABRT); its neighbours, still in their
    # exchange, see gloo's connection to it closed. Either may be the first failure reported.
    aborted = not error.exc_type and "SIGABRT" in str(error)
    lost_neighbour = bool(error.exc_type) and "third_party/gloo" in str(error)
    if not (aborted or lost_neighbour):
        return None
    return ("gloo aborts a process that receives a message larger than the buffer it posted, "
            "and its neighbours then lose their connection: most likely a chunk index. The "
            "chunk a rank sends at a step must be the very chunk its right neighbour receives "
            "at that step (when n is not a multiple of p the chunks differ in size, so a wrong "
            "index shows as a crash, not as a wrong sum). Check each step's chunk indices.")


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
        if not torch.equal(got, want):
            raise AssertionError(
                f"ring_all_reduce ({label}): {_ring_mistake(case, inputs, res, r, p)}")
    for r, res in enumerate(per_rank):
        _grade_ring_traffic(label, case["n"], res["sent"], r, p)


def ring_traffic_bound(n: int, p: int) -> tuple[int, int]:
    """(messages, elements) one rank of a ring all-reduce sends at most: p - 1 steps of
    reduce-scatter and p - 1 of all-gather, one chunk (at most ceil(n / p) elements) each."""
    return 2 * (p - 1), 2 * (p - 1) * -(-n // p)


def _grade_ring_traffic(label: str, n: int, sent: list[int], r: int, p: int) -> None:
    """The right result, sent the wrong way: more data, or more messages, than a ring's."""
    most_messages, most_elements = ring_traffic_bound(n, p)
    sizes = [k for k in sent if k > 0]  # an empty chunk (n < p) may be sent or skipped
    total, largest = sum(sizes), max(sizes, default=0)
    what = (f"the right result, but rank {r} sent {total} elements in {len(sizes)} messages "
            f"(the largest {largest})")
    if total > most_elements:
        shape = ("the whole tensor, more than once" if largest >= n else
                 f"messages larger than one chunk (at most ceil(n / p) = {-(-n // p)} elements)")
        raise AssertionError(
            f"ring_all_reduce ({label}) gives {what}: that is {shape}. A ring sends at most "
            f"{most_elements} elements per rank here, 2 (p - 1) chunks of 1/p of the tensor, so "
            f"each rank's traffic stays under 2 n whatever p is; sending whole tensors grows "
            f"with p. {HINT} shows the plan.")
    if len(sizes) > most_messages:
        raise AssertionError(
            f"ring_all_reduce ({label}) gives {what}: more than a ring's 2 (p - 1) = "
            f"{most_messages}. Every message pays a fixed latency: send each step's chunk whole, "
            f"one message per step. {HINT} shows the plan.")


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
                f"own copy of that chunk (not adding it). {HINT} shows the plan.")
    return (f"on rank {r}, {what}. Check which chunk each step sends and receives: at every "
            "step the chunk a rank sends must be the very chunk its neighbour combines, and "
            "after the reduce-scatter each rank must hold a different finished chunk. Trace "
            f"p = 3 on paper, step by step; {HINT}, asked three times, gives the indices.")
