"""Training-step costs on this runner, measured as ratios in one run:

    bf16 autocast step / fp32 step   mixed precision on this device (on a CPU: does it have bf16
                                     instructions? read from /proc/cpuinfo and torch)
    gpulab.train / hand-written loop the price of the library's loop (AMP plumbing, checkpoint
                                     bookkeeping, progress) on the same model and data: <= 1.05x

Both sides of a ratio run back to back, in alternating order, for several rounds; the figure is
the median of the per-round ratios, so a machine busy with other work slows both sides alike.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from common import Row


def cpu_bf16_flags() -> dict[str, bool]:
    """Which bf16 instruction sets this CPU advertises (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return {name: name in flags for name in ("avx512_bf16", "amx_bf16")}


def _setup(quick: bool, device):
    from gpulab import data, models

    corpus = data.CharCorpus(block_size=32 if quick else 64)
    config = models.GPTConfig(vocab_size=corpus.vocab_size, block_size=corpus.block_size,
                              n_layer=2, n_head=4, n_embd=64 if quick else 128)
    torch.manual_seed(0)
    model = models.GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = data.make_loader(corpus, batch_size=16, seed=0)
    return model, optimizer, loader


def hand_written_loop(model, loader, optimizer, steps, device):
    """The fp32 loop a person writes first: the baseline for gpulab.train."""
    model.train()
    losses, done = [], 0
    while done < steps:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            done += 1
            if done == steps:
                break
    return torch.stack(losses).tolist()


def _timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def paired_ratio(fn_a, fn_b, repeats: int, device) -> tuple[float, float, float]:
    """Median over rounds of time(a) / time(b), with a and b run back to back in each round
    (their order alternating), so that load from other processes hits both sides of a ratio.
    Also returns the median seconds of a and of b."""
    fn_a(), fn_b()  # warm-up: allocator, autocast caches, oneDNN kernel selection
    ratios, times_a, times_b = [], [], []
    for r in range(repeats):
        if r % 2 == 0:
            t_a, t_b = _timed(fn_a, device), _timed(fn_b, device)
        else:
            t_b, t_a = _timed(fn_b, device), _timed(fn_a, device)
        ratios.append(t_a / t_b)
        times_a.append(t_a)
        times_b.append(t_b)
    return statistics.median(ratios), statistics.median(times_a), statistics.median(times_b)


@contextmanager
def one_cpu_thread(device):
    """On a CPU, time with one intra-op thread: when other processes share the cores, OpenMP
    threads that wait at a barrier for a descheduled sibling make some steps 10x slower, which
    no median fixes. Both sides of each ratio run under the same setting."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(quick: bool) -> list[Row]:
    import gpulab

    with one_cpu_thread(gpulab.runner.device):
        return _run(quick)


def _run(quick: bool) -> list[Row]:
    import gpulab
    from gpulab.timing import format_seconds
    from gpulab.train import train

    device, recipe = gpulab.runner.device, gpulab.runner.autocast
    steps, repeats = (5, 3) if quick else (10, 15)
    model, optimizer, loader = _setup(quick, device)
    size = f"GPT {model.num_params() / 1e6:.2f}M params, batch 16x{model.config.block_size}"
    if device.type == "cpu":
        size += ", 1 thread"

    def library(amp):
        return lambda: train(model, loader, optimizer, steps=steps, device=device, amp=amp,
                             progress=False)

    ratio, t_amp, t_fp32 = paired_ratio(library(recipe), library(None), repeats, device)
    rows = [Row("training", f"{recipe.dtype_name} autocast step / fp32 step", ratio, "x",
                note=f"{device.type}, {size}; {format_seconds(t_amp / steps)} vs "
                     f"{format_seconds(t_fp32 / steps)} per step; below 1: mixed precision wins")]
    if device.type == "cpu":
        flags = cpu_bf16_flags()
        listed = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in flags.items()) or "unknown"
        rows.append(Row("training", "CPU has bf16 instructions", float(any(flags.values())),
                        "bool", note=f"{listed}; torch CPU capability "
                                     f"{torch.backends.cpu.get_cpu_capability()}"))

    def hand():
        return hand_written_loop(model, loader, optimizer, steps, device)

    ratio, t_lib, t_hand = paired_ratio(library(None), hand, repeats, device)
    rows.append(Row("training", "gpulab.train / hand-written loop", ratio, "x",
                    target="<= 1.05x", ok=ratio <= 1.05,
                    note=f"fp32, {device.type}, {size}; {format_seconds(t_lib / steps)} vs "
                         f"{format_seconds(t_hand / steps)} per step; median of {repeats} "
                         f"paired rounds of {steps} steps"))
    return rows
