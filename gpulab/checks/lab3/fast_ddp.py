"""Checkers for Lab 3, Part 3: a bucketed wrapper whose all-reduces overlap backward.

    check_make_buckets(make_buckets)                 the spec's buckets, without processes
    check_fast_ddp(FastDDP, make_buckets)    Part 3, on real processes

The wrapper is graded as Part 2's is (simple_ddp.py: rank 0's start everywhere, the mean
gradient, the same parameters as single-process training, identical on every rank), and by
what it asked of torch.distributed in each step: one all-reduce per bucket of the spec's
layout, in bucket order; those launched during backward asynchronous; the first launched
while at least two gradients were still to come (the checker counts them with gradient hooks
of its own, registered after the learner's); every handle waited for before
finish_gradient_sync returns. Hidden cases: uneven buckets, a parameter larger than the cap,
one bucket, and a branch that no rank, or only some ranks, use.
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

from gpulab.checks.harness.owned import require_own_class, require_own_function
from gpulab.checks.harness.ranks import launch
from gpulab.checks.harness.training import call_learner
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.checks.lab3.simple_ddp import (
    BRANCHY,
    DDP_TIMEOUT_S,
    MLP,
    SAME_ORDER_HINT,
    Replay,
    check_start,
    check_steps,
    explain_ddp_crash,
    explain_ddp_hang,
    make_case,
    refuse_borrowed,
)

# Part 3's cases: (model, bucket_numel, use_extra: None or a function of the rank, overlap
# graded). The MLP's parameters, last first, hold 5, 80, 16, 256, 16 and 192 elements.
BUCKET_CASES = {
    "mlp": (MLP, 300, None, True),  # three buckets: [5, 80, 16], [256, 16], [192]
    "uneven": (MLP, 100, None, True),  # parameters past the cap get buckets of their own
    "one_bucket": (MLP, 10**6, None, False),  # nothing to overlap with
    "unused": (BRANCHY, 100, lambda rank: False, False),  # `extra` unused on every rank
    "unused_some": (BRANCHY, 100, lambda rank: rank == 0, False),  # used on rank 0 only
}


def reference_buckets(numels: list[int], bucket_numel: int) -> list[list[int]]:
    """The spec's buckets: parameter indices, last parameter first; a bucket is closed when the
    next parameter would take it past bucket_numel (so a larger parameter is alone)."""
    buckets, size = [], 0
    for i in reversed(range(len(numels))):
        if buckets and buckets[-1] and size + numels[i] > bucket_numel:
            buckets.append([])
            size = 0
        if not buckets:
            buckets.append([])
        buckets[-1].append(i)
        size += numels[i]
    return buckets


MAKE_BUCKETS_CASES = (([192, 16, 256, 16, 80, 5], 300), ([10, 10, 10], 30), ([4], 1),
                      ([3, 50, 3, 3], 10), ([7, 7, 7, 7, 7], 14))


def check_make_buckets(make_buckets, cases=MAKE_BUCKETS_CASES) -> None:
    """make_buckets(numels, bucket_numel) returns the spec's buckets (see reference_buckets)."""
    require_own_function(make_buckets, "make_buckets")
    for numels, cap in cases:
        case = f"numels={list(numels)}, bucket_numel={cap}"
        got = call_learner(make_buckets, "make_buckets", list(numels), cap, case=case)
        want = reference_buckets(list(numels), cap)
        try:
            got = [[int(i) for i in bucket] for bucket in got]
        except (TypeError, ValueError):
            raise AssertionError(f"make_buckets ({case}) returned {got!r}: return a list of "
                                 "buckets, each a list of parameter indices.") from None
        if got == want:
            continue
        hint = "Start from the last parameter and walk back to the first."
        if got == [[len(numels) - 1 - i for i in b] for b in want] or (
                sorted(got[0]) == got[0] and len(got[0]) > 1):
            hint = ("Buckets hold the parameters last first (index len(numels) - 1 first): "
                    "backward computes the last layer's gradients first, so the first bucket "
                    "fills first and can start its all-reduce while backward goes on.")
        elif any(sum(numels[i] for i in b) > cap and len(b) > 1 for b in got):
            hint = ("A bucket holds more than bucket_numel elements: close it before a "
                    "parameter that would take it past the cap (a parameter larger than the cap "
                    "gets a bucket of its own).")
        elif len(got) > len(want):
            hint = ("Fill each bucket up to bucket_numel: close it only when the next "
                    "parameter would not fit.")
        raise AssertionError(f"make_buckets ({case}) returned {got}, expected {want}. {hint}")


def check_fast_ddp(FastDDP, make_buckets, world_size: int = 2,
                       cases=("mlp",), seed: int = 0) -> None:
    """make_buckets first; then FastDDP(model, bucket_numel) on `world_size` ranks, for each
    named case of BUCKET_CASES: the same results as Part 2, plus one asynchronous all-reduce per
    bucket, in bucket order, the first launched while backward still runs, all waited for."""
    check_make_buckets(make_buckets)
    require_own_class(FastDDP, "FastDDP")
    p = world_size
    built = []
    for i, name in enumerate(cases):
        model, cap, use_extra, overlap = BUCKET_CASES[name]
        label = f"{'an MLP' if model is MLP else 'a model with an unused branch'}, " \
                f"bucket_numel={cap}, on {p} ranks"
        if use_extra is not None:
            used = [str(r) for r in range(p) if use_extra(r)]
            label += (f", the branch used on rank {' and '.join(used)} only" if used
                      else ", the branch used on no rank")
        built.append((make_case(label, model, seed + 13 * i + p, p, {"bucket_numel": cap},
                            use_extra), cap, overlap))
    results = launch(lab3_ranks.ddp_rank, p, FastDDP, [c for c, _, _ in built],
                     name="FastDDP", case=f"{p} ranks", timeout_s=DDP_TIMEOUT_S,
                     ship=(lab3_ranks,), explain_hang=explain_ddp_hang,
                     explain_crash=explain_ddp_crash)
    for i, (case, cap, overlap) in enumerate(built):
        per_rank = [results[r][i] for r in range(p)]
        refuse_borrowed("FastDDP", per_rank)
        replay = Replay(case, p)
        check_start("FastDDP", case["label"], per_rank, replay)
        numels = [s.numel() for s in replay.starts[0]]
        _check_buckets(case["label"], per_rank, numels, cap, overlap)
        check_steps("FastDDP", case["label"], per_rank, replay, p)


def _check_buckets(label: str, results, numels, cap: int, overlap: bool) -> None:
    layout = reference_buckets(numels, cap)
    sizes = [sum(numels[i] for i in bucket) for bucket in layout]
    where = f"FastDDP ({label})"
    for r, res in enumerate(results):
        for step in range(len(res["grads"])):
            calls = [c for c in res["calls"] if c["call"] == "all_reduce" and c["step"] == step
                     and c["phase"] in ("backward", "finish")]
            got = [c["numel"] for c in calls]
            if got != sizes:
                if sorted(got) == sorted(sizes):
                    why = f"in another order. {SAME_ORDER_HINT}"
                elif len(got) == len(numels) and len(sizes) != len(numels):
                    why = "one per parameter: put the parameters into buckets (make_buckets)."
                else:
                    why = ("the buckets are the parameters last first, each bucket closed "
                           "before a parameter that would take it past bucket_numel: one "
                           "all_reduce per bucket, of its flat buffer.")
                raise AssertionError(
                    f"{where}, step {step}: rank {r} all-reduced tensors of {got} elements; the "
                    f"buckets hold {sizes}, and each must go once, in bucket order: {why}")
            blocking = [c for c in calls if c["phase"] == "backward" and not c["async"]]
            if blocking:
                raise AssertionError(
                    f"{where}, step {step}: an all-reduce launched during backward was blocking "
                    "(async_op=False): backward then stops at every bucket until its sum has "
                    "arrived. Launch with dist.all_reduce(flat, async_op=True), keep the handle, "
                    "and wait for it in finish_gradient_sync.")
            if res["unwaited"][step]:
                raise AssertionError(
                    f"{where}, step {step}: finish_gradient_sync returned without waiting for "
                    f"{res['unwaited'][step]} of the {len(calls)} all-reduce handles. Call "
                    "handle.wait() on each before reading its bucket: until then the all-reduce "
                    "may still be running, and the bucket holds a partial sum.")
            early = [c for c in calls if c["phase"] == "backward" and (c["pending"] or 0) >= 2]
            if overlap and len(sizes) > 1 and not early:
                in_backward = any(c["phase"] == "backward" for c in calls)
                raise AssertionError(
                    f"{where}, step {step}: "
                    + ("every bucket was launched at the very end of backward, when the last "
                       "gradients came in" if in_backward else
                       "every bucket was all-reduced in finish_gradient_sync, after backward "
                       "had finished")
                    + ": nothing overlapped. Launch each bucket from a gradient hook "
                    "(p.register_post_accumulate_grad_hook) as soon as its last gradient is "
                    "in, so that it travels while backward computes the earlier layers' "
                    "gradients.")
