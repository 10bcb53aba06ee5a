"""Where one training step's time goes on a rank: computing, communicating, or neither (idle).

    loss, breakdown = profile_step(run_one_step, device)      # inside the training loop
    breakdown == {"step_s": 0.21, "compute_s": 0.12, "communication_s": 0.08,
                  "overlap_s": 0.01, "idle_s": 0.02, "top_communication": [...]}

torch.profiler records the step; gpulab.profiling.trace turns its events into OpCalls, and each
outermost op is either communication (a c10d collective: FSDP2's all-gathers, reduce-scatters,
the loss's all-reduce, and the waits on them) or compute (every other aten op). The intervals
are merged (gpulab.profiling.trace.busy_seconds), so nested ops count once:

    compute_s         time covered by compute ops
    communication_s   time covered by collectives, waits included
    overlap_s         time covered by both: communication hidden behind compute
    idle_s            the step's time covered by neither: Python, hooks, the host waiting

On a GPU, compute is the device's kernels (the CUDA timeline) and communication the NCCL kernels
among them; the host's ops are not counted twice.
Taught in: lessons/08_profiling_and_optimization.ipynb; the capstone
"""

from __future__ import annotations

import os

import torch

# c10d::* is the call that queues a collective (FSDP2's _allgather_base_, _reduce_scatter_base_),
# gloo:* the collective itself on gloo's thread, nccl* NCCL's kernels on a GPU.
COMMUNICATION = ("c10d::", "gloo:", "nccl", "record_param_comms")


def is_communication(name: str) -> bool:
    return name.lower().startswith(COMMUNICATION)


def profile_step(run, device) -> tuple:
    """Run `run()` (one training step, returning its loss) under torch.profiler; return
    (its return value, a breakdown dict as in the module doc)."""
    from torch.profiler import ProfilerActivity

    from gpulab.profiling.steps import KINETO_QUIET

    device = torch.device(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
    with torch.profiler.profile(activities=activities) as prof:
        with torch.profiler.record_function("capstone_step"):
            out = run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    return out, breakdown(prof.events())


def breakdown(events) -> dict:
    """The step's compute, communication, overlap and idle seconds, from profiler events."""
    from gpulab.profiling.trace import Span, busy_seconds, records_from_events

    _, _, ops, kernels = records_from_events(events)
    step = next((e for e in events if e.name == "capstone_step"), None)
    if step is None:
        raise ValueError("no 'capstone_step' range in the profile: use profile_step")
    window = Span("step", step.time_range.start / 1e6, step.time_range.end / 1e6)  # s
    if kernels:  # a GPU: the device's timeline is where the time goes
        spans = [(k.start_s, k.end_s, k.name) for k in kernels]
    else:  # the host: its outermost aten ops, and the collectives on any thread
        spans = [(op.start_s, op.end_s, op.name) for op in ops
                 if op.outermost or is_communication(op.name)]
    comm = [(a, b) for a, b, name in spans if is_communication(name)]
    compute = [(a, b) for a, b, name in spans if not is_communication(name)]
    comm_s, compute_s = busy_seconds(comm, window), busy_seconds(compute, window)
    either_s = busy_seconds(comm + compute, window)
    totals: dict[str, float] = {}
    for a, b, name in spans:
        if is_communication(name):
            totals[name] = totals.get(name, 0.0) + (b - a)
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:5]
    return {"step_s": window.duration_s, "compute_s": compute_s, "communication_s": comm_s,
            "overlap_s": comm_s + compute_s - either_s,
            "idle_s": max(0.0, window.duration_s - either_s),
            "top_communication": [[name, s] for name, s in top]}
