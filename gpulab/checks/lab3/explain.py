"""What went wrong with a learner's data-parallel wrapper, in words: where the ranks'
collectives first differed (a hang, or gloo aborting), a tensor sent off the parameters' device,
buckets that mix dtypes, and code borrowed from gpulab or torch. Read from each rank's CallLog
(harness/calls.py) by simple_ddp.py and fast_ddp.py.
"""

from __future__ import annotations

import re

from gpulab.checks.harness.ranks import PHASE_WORDS


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
