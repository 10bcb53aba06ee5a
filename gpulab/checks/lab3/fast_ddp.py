"""Checkers for Lab 3, Part 3: a bucketed wrapper whose all-reduces overlap backward.

    check_make_buckets(make_buckets)         the spec's buckets (in bytes, one kind each)
    check_fast_ddp(FastDDP, make_buckets)    Part 3, on real processes

The wrapper is graded as Part 2's is (simple_ddp.py: rank 0's start everywhere, the mean
gradient, the same parameters as single-process training, identical on every rank), and by
what it asked of torch.distributed in each step: one all-reduce per bucket of the spec's
layout, in bucket order, of the bucket's dtype and on the parameters' device (and, in
finish_gradient_sync, one of the used-flags); those launched during backward asynchronous; the
first launched while at least two gradients were still to come (the checker counts them with
gradient hooks of its own, registered after the learner's); every handle waited for before
finish_gradient_sync returns. Visible cases: an MLP, and simple_ddp.REAL (frozen, bf16, partly
used and unused layers, AdamW). Hidden cases: uneven buckets, a parameter larger than the cap,
one bucket, a branch that no rank, or only some ranks, use, and REAL on 3 ranks.
Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import functools

import gpulab
from gpulab.checks.harness.owned import require_own_class, require_own_function
from gpulab.checks.harness.ranks import launch
from gpulab.checks.harness.training import call_learner
from gpulab.checks.lab3 import ranks as lab3_ranks
from gpulab.checks.lab3.cases import (
    ADAMW,
    BRANCHY,
    MLP,
    REAL,
    REAL_LABEL,
    SGD,
    Replay,
    make_case,
    real_case,
)
from gpulab.checks.lab3.explain import (
    DEVICE_HINT,
    DTYPE_HINT,
    SAME_ORDER_HINT,
    describe_call,
    explain_ddp_crash,
    explain_ddp_hang,
    refuse_borrowed,
)
from gpulab.checks.lab3.simple_ddp import DDP_TIMEOUT_S, check_start, check_steps

# Part 3's cases: (model, bucket_bytes, use_extra: None or a function of the rank, overlap
# graded, optimizer). The MLP's parameters, last first, hold 5, 80, 16, 256, 16 and 192 float32
# elements: 20, 320, 64, 1024, 64 and 768 bytes.
BUCKET_CASES = {
    "mlp": (MLP, 1200, None, True, SGD),  # three buckets: [5, 80, 16], [256, 16], [192]
    "uneven": (MLP, 400, None, True, SGD),  # parameters past the cap get buckets of their own
    "one_bucket": (MLP, 4 * 10**6, None, False, SGD),  # nothing to overlap with
    "unused": (BRANCHY, 400, lambda rank: False, False, SGD),  # `extra` unused on every rank
    "unused_some": (BRANCHY, 400, lambda rank: rank == 0, False, SGD),  # used on rank 0 only
    # frozen, bf16, partly used and unused parameters, AdamW: buckets [[7, 6, 5, 4], [3, 2],
    # [1], [0]] of the trainable ones (the bf16 layer's two apart)
    "real": (REAL, 700, lambda rank: rank == 0, False, ADAMW),
}


def _without_flags(calls: list[dict], n_params: int, *layouts: list[int]) -> list[dict]:
    """The bucket all-reduces among `calls`: without the one of the used-flags (a tensor of one
    entry per trainable parameter, in finish_gradient_sync), where the wrapper sends one. Where
    a bucket might have that size too, the one whose removal leaves one of `layouts`."""
    flags = [k for k, c in enumerate(calls) if c["phase"] == "finish" and c["numel"] == n_params]
    for sizes in layouts:
        for k in flags:
            rest = calls[:k] + calls[k + 1:]
            if [c["numel"] for c in rest] == sizes:
                return rest
    return calls[:flags[-1]] + calls[flags[-1] + 1:] if flags else calls


def reference_buckets(nbytes: list[int], bucket_bytes: int, kinds=None) -> list[list[int]]:
    """The spec's buckets: parameter indices, last parameter first. Each parameter joins the
    open bucket of its kind (dtype and device; kinds=None: all alike), which is closed first
    when the parameter would take it past bucket_bytes (so a larger parameter is alone).
    Buckets in the order they were opened."""
    kinds = [None] * len(nbytes) if kinds is None else list(kinds)
    buckets, open_bucket, size = [], {}, {}
    for i in reversed(range(len(nbytes))):
        kind = kinds[i]
        if kind not in open_bucket or size[kind] + nbytes[i] > bucket_bytes:
            buckets.append([])
            open_bucket[kind], size[kind] = len(buckets) - 1, 0
        buckets[open_bucket[kind]].append(i)
        size[kind] += nbytes[i]
    return buckets


F32, BF16 = "float32", "bfloat16"
MAKE_BUCKETS_CASES = (
    ([768, 64, 1024, 64, 320, 20], 1200, None), ([40, 40, 40], 120, None), ([16], 4, None),
    ([12, 200, 12, 12], 40, None), ([28, 28, 28, 28, 28], 56, None),
    ([768, 64, 512, 32, 320, 20], 1000, [F32, F32, BF16, BF16, F32, F32]),
    ([8, 8, 8, 8], 100, [F32, BF16, F32, BF16]))


def check_make_buckets(make_buckets, cases=MAKE_BUCKETS_CASES) -> None:
    """make_buckets(nbytes, bucket_bytes, kinds) returns the spec's buckets (reference_buckets)."""
    require_own_function(make_buckets, "make_buckets")
    for nbytes, cap, kinds in cases:
        case = f"nbytes={list(nbytes)}, bucket_bytes={cap}" + (
            f", kinds={list(kinds)}" if kinds else "")
        args = (list(nbytes), cap) + ((list(kinds),) if kinds else ())
        got = call_learner(make_buckets, "make_buckets", *args, case=case)
        want = reference_buckets(list(nbytes), cap, kinds)
        try:
            got = [[int(i) for i in bucket] for bucket in got]
        except (TypeError, ValueError):
            raise AssertionError(f"make_buckets ({case}) returned {got!r}: return a list of "
                                 "buckets, each a list of parameter indices.") from None
        if got == want:
            continue
        hint = "Start from the last parameter and walk back to the first."
        if kinds and any(len({kinds[i] for i in b}) > 1 for b in got):
            hint = ("A bucket mixes kinds: a bucket is one flat tensor, of one dtype on one "
                    "device, so each kind fills buckets of its own. Keep one open bucket per "
                    "kind, and put each parameter into its kind's.")
        elif kinds and got == reference_buckets(list(nbytes), cap, list(range(len(nbytes)))):
            hint = "Parameters of the same kind share a bucket while it has room."
        elif kinds:
            hint = ("Keep one open bucket per kind: a parameter goes into its kind's open "
                    "bucket, which closes (for that kind only) when the parameter would take "
                    "it past bucket_bytes. Buckets come out in the order they were opened.")
        elif got == [[len(nbytes) - 1 - i for i in b] for b in want] or (
                sorted(got[0]) == got[0] and len(got[0]) > 1):
            hint = ("Buckets hold the parameters last first (index len(nbytes) - 1 first): "
                    "backward computes the last layer's gradients first, so the first bucket "
                    "fills first and can start its all-reduce while backward goes on.")
        elif any(sum(nbytes[i] for i in b) > cap and len(b) > 1 for b in got):
            hint = ("A bucket holds more than bucket_bytes: close it before a parameter that "
                    "would take it past the cap (a parameter larger than the cap gets a bucket "
                    "of its own).")
        elif len(got) > len(want):
            hint = ("Fill each bucket up to bucket_bytes: close it only when the next "
                    "parameter would not fit.")
        raise AssertionError(f"make_buckets ({case}) returned {got}, expected {want}. {hint}")


def check_fast_ddp(FastDDP, make_buckets, world_size: int = 2,
                   cases=("mlp", "real"), seed: int = 0) -> None:
    """make_buckets first; then FastDDP(model, bucket_bytes) on `world_size` ranks, for each
    named case of BUCKET_CASES: the same results as Part 2 (torch DDP's rules included), plus
    one asynchronous all-reduce per bucket, in bucket order, of its parameters' dtype and
    device, the first launched while backward still runs, all waited for."""
    check_make_buckets(make_buckets)
    require_own_class(FastDDP, "FastDDP")
    p = world_size
    built = []
    for i, name in enumerate(cases):
        model, cap, use_extra, overlap, optimizer = BUCKET_CASES[name]
        label = {MLP["kind"]: "an MLP", BRANCHY["kind"]: "a model with an unused branch",
                 REAL["kind"]: REAL_LABEL.replace(" on rank 0 only", "")}[model["kind"]]
        label += f", bucket_bytes={cap}, on {p} ranks"
        if use_extra is not None:
            used = [str(r) for r in range(p) if use_extra(r)]
            label += (f", the branch used on rank {' and '.join(used)} only" if used
                      else ", the branch used on no rank")
        built.append((make_case(label, model, seed + 13 * i + p, p, {"bucket_bytes": cap},
                                use_extra, optimizer=optimizer), cap, overlap))
    _run_and_check(FastDDP, built, p, "gloo")
    if gpulab.runner.name == "gpu" and gpulab.runner.gpu_count:
        # The same rules on GPUs with nccl, one GPU per rank: buffers left on the CPU fail here.
        gpus = min(p, gpulab.runner.gpu_count)
        _, cap, _, _, _ = BUCKET_CASES["real"]
        case = real_case(seed + 101, gpus, {"bucket_bytes": cap}, device="cuda")
        _run_and_check(FastDDP, [(case, cap, False)], gpus, "nccl")


def _run_and_check(FastDDP, built, p: int, backend: str) -> None:
    device = "cuda" if backend == "nccl" else "cpu"
    where = f"{p} GPUs, nccl" if device == "cuda" else f"{p} ranks"
    results = launch(lab3_ranks.ddp_rank, p, FastDDP, [c for c, _, _ in built],
                     name="FastDDP", case=where, timeout_s=DDP_TIMEOUT_S,
                     ship=(lab3_ranks,), explain_hang=explain_ddp_hang,
                     explain_crash=functools.partial(explain_ddp_crash, device=device),
                     backend=backend)
    for i, (case, cap, overlap) in enumerate(built):
        per_rank = [results[r][i] for r in range(p)]
        refuse_borrowed("FastDDP", per_rank)
        replay = Replay(case, p, follow=per_rank[0]["params"])
        check_start("FastDDP", case["label"], per_rank, replay)
        _check_buckets(case["label"], per_rank, replay, cap, overlap, device)
        check_steps("FastDDP", case["label"], per_rank, replay, p)


def _check_buckets(label: str, results, replay, cap: int, overlap: bool,
                   device: str = "cpu") -> None:
    trainable = [i for i, frozen in enumerate(replay.frozen) if not frozen]
    starts = replay.starts[0]
    nbytes = [starts[i].numel() * starts[i].element_size() for i in trainable]
    numels = [starts[i].numel() for i in trainable]
    kinds = [str(starts[i].dtype).removeprefix("torch.") for i in trainable]
    layout = reference_buckets(nbytes, cap, kinds)
    sizes = [sum(numels[i] for i in bucket) for bucket in layout]
    mixed = [sum(numels[i] for i in b) for b in reference_buckets(nbytes, cap)]  # kinds ignored
    everything = [p.numel() * p.element_size() for p in starts]
    with_frozen = [sum(starts[i].numel() for i in b) for b in reference_buckets(
        everything, cap, [p.dtype for p in starts])]
    where = f"FastDDP ({label})"
    for r, res in enumerate(results):
        off = next((c for c in res["calls"] if c.get("device") not in (None, device)), None)
        if off is not None:
            raise AssertionError(f"{where}, rank {r}: its {describe_call(off)} was given a "
                                 f"tensor on the device '{off['device']}', while the parameters "
                                 f"are on '{device}'. {DEVICE_HINT}")
        for step in range(len(res["grads"])):
            calls = _without_flags([c for c in res["calls"] if c["call"] == "all_reduce"
                                    and c["step"] == step
                                    and c["phase"] in ("backward", "finish")],
                                   len(trainable), sizes, mixed, with_frozen)
            got = [c["numel"] for c in calls]
            if got != sizes:
                if sorted(got) == sorted(sizes):
                    why = f"in another order. {SAME_ORDER_HINT}"
                elif got == mixed:
                    why = DTYPE_HINT
                elif len(got) == len(numels) and len(sizes) != len(numels):
                    why = "one per parameter: put the parameters into buckets (make_buckets)."
                elif got == with_frozen:
                    why = ("the frozen parameters (requires_grad=False) went too: leave them "
                           "out of the buckets, as torch's DDP does (no gradient, no "
                           "all-reduce).")
                else:
                    why = ("the buckets are the parameters last first, each bucket closed "
                           "before a parameter that would take it past bucket_bytes: one "
                           "all_reduce per bucket, of its flat buffer.")
                raise AssertionError(
                    f"{where}, step {step}: rank {r} all-reduced tensors of {got} elements; the "
                    f"buckets hold {sizes}, and each must go once, in bucket order: {why}")
            for call, bucket in zip(calls, layout, strict=True):
                if call["dtype"] != kinds[bucket[0]]:
                    raise AssertionError(
                        f"{where}, step {step}: rank {r} all-reduced the bucket of "
                        f"{call['numel']} elements as {call['dtype']}, but its parameters are "
                        f"{kinds[bucket[0]]}. {DTYPE_HINT}")
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
