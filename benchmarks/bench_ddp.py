"""gpulab's DDP steps against torch.nn.parallel.DistributedDataParallel
(lessons/05_multi_gpu_strategies.ipynb).

Two gloo ranks train the same MLP on the same data with each wrapper, same bucket cap. A step
is forward + backward + gradient sync + optimizer step; the wrappers take turns step by step, so
machine noise hits them alike; a step's time is the slower rank's, and a ratio is the median of
the step-by-step ratios. Target:

    OverlappedDDP / torch DDP step    <= 1.25x: the same algorithm (buckets in reverse order,
                                      async all-reduce from gradient hooks), driven from Python
NaiveDDP and BucketedDDP are reported beside it (no target): what buckets and overlap buy.

Same cap, not quite the same buckets: torch closes a bucket once it reaches the cap,
gpulab before it would pass it (see assign_buckets), so gpulab sends more, smaller buckets here
(8 against 4 in the full run: each 4 MiB weight alone, then each bias alone); the ratio
includes that.
"""

from __future__ import annotations

import statistics

from common import Row

from gpulab.distributed import run_on_ranks

NAME = "ddp"
WORLD_SIZE = 2
TARGET = 1.25


def _time_on_rank(rank, world_size, sizes, bucket_bytes, steps, warmup):
    """Per step, this rank's seconds for each wrapper, and its final parameters."""
    import time

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from gpulab.distributed.data_parallel import BucketedDDP, NaiveDDP, OverlappedDDP
    from gpulab.models import MLP

    in_features, hidden, n_hidden, batch = sizes
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch * world_size, in_features, generator=g)
    y = torch.randint(0, 10, (batch * world_size,), generator=g)
    mine = slice(rank * batch, (rank + 1) * batch)

    def model():
        torch.manual_seed(0)
        return MLP(in_features, 10, hidden=hidden, n_hidden=n_hidden)

    wrappers = {  # torch counts the same bytes in MB (2**20 bytes)
        "torch": (DistributedDataParallel(model(), bucket_cap_mb=bucket_bytes / 2**20), None),
        "overlapped": (ddp := OverlappedDDP(model(), bucket_bytes), ddp.finish_gradient_sync),
        "bucketed": (ddp := BucketedDDP(model(), bucket_bytes), ddp.finish_gradient_sync),
        "naive": (ddp := NaiveDDP(model()), ddp.finish_gradient_sync),
    }
    optimizers = {name: torch.optim.SGD(w.parameters(), lr=0.01, momentum=0.9)
                  for name, (w, _) in wrappers.items()}
    times = {name: [] for name in wrappers}
    for i in range(warmup + steps):
        for name, (wrapper, sync) in wrappers.items():
            dist.barrier()  # start together: a step's time is not another rank's lateness
            start = time.perf_counter()
            optimizers[name].zero_grad(set_to_none=True)
            F.cross_entropy(wrapper(x[mine]), y[mine]).backward()
            if sync is not None:  # torch DDP waits for its buckets at the end of backward
                sync()
            optimizers[name].step()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    params = {name: [p.detach().clone() for p in w.parameters()]
              for name, (w, _) in wrappers.items()}
    return times, params


def run(quick: bool = False) -> list[Row]:
    # (in_features, hidden, n_hidden, batch per rank): 4.2M parameters (17 MB of gradients),
    # each 1024x1024 weight a 4 MiB bucket; a step takes tens of ms (quick: about 10 ms).
    sizes = (512, 512, 3, 64) if quick else (1024, 1024, 4, 64)
    bucket_bytes = int((1.5 if quick else 4.0) * 2**20)
    steps, warmup = (25, 3) if quick else (21, 3)
    per_rank = run_on_ranks(_time_on_rank, WORLD_SIZE, sizes, bucket_bytes, steps, warmup,
                            backend="gloo", timeout_s=600)
    params = per_rank[0][1]
    for name, ps in params.items():  # figures from a wrapper that trains wrong mean nothing
        for p, q in zip(ps, params["torch"], strict=True):
            if not torch_allclose(p, q):
                raise AssertionError(f"{name} trained different parameters than torch DDP")
    step_s = {name: [max(ts) for ts in zip(*(r[0][name] for r in per_rank), strict=True)]
              for name in params}  # a step takes as long as its slower rank

    def ratio(name):  # median of step-by-step ratios: a busy moment slows both sides alike
        return statistics.median(a / b for a, b in zip(step_s[name], step_s["torch"],
                                                       strict=True))

    note = (f"gloo, {WORLD_SIZE} ranks, MLP {sizes[0]}-{sizes[1]}x{sizes[2]}, batch {sizes[3]}"
            f"/rank, buckets of {bucket_bytes / 2**20:g} MiB, torch DDP step "
            f"{statistics.median(step_s['torch']) * 1e3:.1f} ms, median of {steps}")
    rows = [Row(NAME, "OverlappedDDP / torch DDP step time", ratio("overlapped"), "x",
                target=f"<= {TARGET}x", ok=ratio("overlapped") <= TARGET, note=note)]
    for name, label in (("bucketed", "BucketedDDP"), ("naive", "NaiveDDP")):
        rows.append(Row(NAME, f"{label} / torch DDP step time", ratio(name), "x", note=note))
    return rows


def torch_allclose(a, b) -> bool:
    import torch

    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)
