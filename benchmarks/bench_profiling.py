"""What torch.profiler costs a training step (lessons/08_profiling_and_optimization.ipynb):

    profiled step / plain step     the same labelled GPT training step
                                   (gpulab.profiling.labelled_training_step) timed without the
                                   profiler and under profile_steps (record_shapes, with_flops,
                                   as the regime analysis needs): <= 1.5x
    ... with Python stacks         the same with with_stack=True (reported, no target): what
                                   linking each op to its line of code costs

A profiled step's time is its ProfilerStep span (the profiler's own bookkeeping included); a
plain step's is perf_counter around it (after a device sync on a GPU). The two sides take turns
round by round, in alternating order, and the figure is the median of the per-round ratios, so a
machine busy with other work slows both alike. Processing the trace after the run (records,
JSON export) is not part of a step: the note gives its time per run.
"""

from __future__ import annotations

import statistics
import time

import torch
from bench_training import one_cpu_thread
from common import Row

NAME = "profiling"
TARGET = 1.5


def _setup(device):
    """The same model in quick mode: the profiler's cost is per op, so a smaller model would
    show a larger ratio, not the same one measured faster."""
    from gpulab import data, models

    corpus = data.CharCorpus(block_size=64)
    config = models.GPTConfig(vocab_size=corpus.vocab_size, block_size=corpus.block_size,
                              n_layer=2, n_head=4, n_embd=128)
    torch.manual_seed(0)
    model = models.GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = data.make_loader(corpus, batch_size=16, seed=0)
    return model, optimizer, loader


def _plain_step_s(step, steps: int, device) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _profiled_step_s(step, steps: int, device, with_stack: bool) -> tuple[float, float]:
    """(median profiled step, seconds spent on the run outside the steps)."""
    from gpulab.profiling import profile_steps

    start = time.perf_counter()
    result = profile_steps(step, steps=steps, warmup=1, device=device, with_stack=with_stack)
    outside = time.perf_counter() - start - sum(result.step_times_s)
    return statistics.median(result.step_times_s), outside


def run(quick: bool = False) -> list[Row]:
    import gpulab

    with one_cpu_thread(gpulab.runner.device):
        return _run(quick)


def _run(quick: bool) -> list[Row]:
    import gpulab
    from gpulab.profiling import labelled_training_step
    from gpulab.timing import format_seconds

    device = gpulab.runner.device
    steps, rounds = (3, 2) if quick else (10, 9)
    model, optimizer, loader = _setup(device)
    step = labelled_training_step(model, loader, optimizer, device=device)
    for _ in range(3):  # warm-up: allocator, oneDNN kernel choice, lazy CUDA init
        step()
    ratios = {False: [], True: []}
    plain, profiled, outside = [], {False: [], True: []}, []
    for r in range(rounds):
        for with_stack in (False, True):
            order = ("plain", "profiled") if r % 2 == 0 else ("profiled", "plain")
            for side in order:
                if side == "plain":
                    t_plain = _plain_step_s(step, steps, device)
                else:
                    t_prof, extra = _profiled_step_s(step, steps, device, with_stack)
            ratios[with_stack].append(t_prof / t_plain)
            plain.append(t_plain)
            profiled[with_stack].append(t_prof)
            if not with_stack:
                outside.append(extra)
    size = (f"GPT {model.num_params() / 1e6:.2f}M params, batch 16x{model.config.block_size}, "
            f"{device.type}" + (", 1 thread" if device.type == "cpu" else ""))
    ratio = statistics.median(ratios[False])
    return [
        Row(NAME, "profiled / plain training step", ratio, "x", target=f"<= {TARGET}x",
            ok=ratio <= TARGET,
            note=f"{size}; {format_seconds(statistics.median(profiled[False]))} vs "
                 f"{format_seconds(statistics.median(plain))} per step, median of {rounds} "
                 f"rounds of {steps}; trace processing "
                 f"{format_seconds(statistics.median(outside))} per run"),
        Row(NAME, "profiled with_stack / plain training step", statistics.median(ratios[True]),
            "x", note=f"{size}; {format_seconds(statistics.median(profiled[True]))} per step"),
    ]
