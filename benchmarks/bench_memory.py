"""Memory estimate against measured peak, and what measuring costs
(lessons/07_gpu_memory.ipynb).

    estimate vs measured peak     |error| <= 5% on the MLP, the CNN and the tiny GPT, in fp32 and
                                  in the runner's mixed-precision recipe (the course's budget;
                                  on the cpu runner the paper step matches to the byte)
    tracked / plain step time     what the tensor tracker's dispatch mode costs per step
                                  (reported; the cpu runner measures with it, a GPU with the
                                  allocator's counters, which cost nothing)
    checkpointing                 peak memory saved and extra FLOPs on the tiny GPT (reported)

Measured on this runner's device: the tracker on the CPU, max_memory_allocated on CUDA. The
time ratio alternates tracked and plain steps round by round and takes the median of the
per-round ratios, so a busy machine slows both sides alike.
"""

from __future__ import annotations

import statistics
import time

import torch
from common import Row

NAME = "memory"
TARGET = 0.05


def _cases(quick: bool, device):
    from gpulab.models import GPT, MLP, GPTConfig, SmallCNN

    scale = 1 if quick or device.type == "cpu" else 4  # a GPU gets bigger batches
    g = torch.Generator().manual_seed(0)
    return {
        "MLP": (MLP(64, 10, hidden=128), (torch.randn(256 * scale, 64, generator=g),
                                         torch.randint(0, 10, (256 * scale,), generator=g))),
        "SmallCNN": (SmallCNN(), (torch.randn(128 * scale, 1, 8, 8, generator=g),
                                  torch.randint(0, 10, (128 * scale,), generator=g))),
        "tiny GPT": (GPT(GPTConfig()), (torch.randint(0, 64, (16 * scale, 32), generator=g),
                                        torch.randint(0, 64, (16 * scale, 32), generator=g))),
    }


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run(quick: bool = False) -> list[Row]:
    import gpulab
    from gpulab.memory import (
        MemoryTracker,
        checkpointing_tradeoff,
        estimate_memory,
        measure_step,
        training_step,
    )

    device = gpulab.runner.device
    recipes = {"fp32": None, gpulab.runner.autocast.dtype_name: gpulab.runner.autocast}
    rows = []
    for label, recipe in recipes.items():
        torch.manual_seed(0)
        for name, (model, batch) in _cases(quick, device).items():
            model = model.to(device)
            opt = torch.optim.Adam(model.parameters())
            measured = measure_step(model, batch, opt, amp=recipe)
            extra = {"seq_len": batch[0].shape[1]} if name == "tiny GPT" else {}
            est = estimate_memory(model, len(batch[0]), optimizer=opt, precision=recipe,
                                  device_type=device.type, **extra)
            error = measured.error_of(est)
            rows.append(Row(NAME, f"{name} {label}: estimate vs measured peak", abs(error) * 100,
                            "%", target=f"<= {TARGET:.0%}", ok=abs(error) <= TARGET,
                            note=f"{device.type}, batch {len(batch[0])}, Adam: estimated "
                                 f"{est.peak_bytes / 2**20:.3f} MiB, measured "
                                 f"{measured.peak_bytes / 2**20:.3f} MiB, peak in "
                                 f"{measured.peak_phase}"))

    # The tracker's cost: the same step with and without it, alternating.
    model, batch = _cases(quick, device)["tiny GPT"]
    model = model.to(device)
    batch = tuple(t.to(device) for t in batch)
    opt = torch.optim.Adam(model.parameters())
    for _ in range(2):
        training_step(model, opt, batch)  # warm up, and make the optimizer state

    def tracked():
        with MemoryTracker(model=model, optimizer=opt, tensors=batch):
            training_step(model, opt, batch)

    rounds = 5 if quick else 15
    ratios, plain_s = [], []
    for _ in range(rounds):
        plain = _timed(lambda: training_step(model, opt, batch))
        ratios.append(_timed(tracked) / plain)
        plain_s.append(plain)
    rows.append(Row(NAME, "tracked / plain training step time", statistics.median(ratios), "x",
                    note=f"tiny GPT, {device.type}, plain step "
                         f"{statistics.median(plain_s) * 1e3:.1f} ms, median of {rounds}"))

    torch.manual_seed(0)
    gpt, gpt_batch = _cases(True, device)["tiny GPT"]
    gpt = gpt.to(device)
    tradeoff = checkpointing_tradeoff(gpt, gpt_batch)
    rows.append(Row(NAME, "checkpoint_blocks: peak memory saved", tradeoff.memory_saved * 100,
                    "%", note=f"tiny GPT, batch {len(gpt_batch[0])}, fp32, Adam"))
    rows.append(Row(NAME, "checkpoint_blocks: extra FLOPs per step",
                    tradeoff.extra_compute * 100, "%", note="one more forward of the Blocks"))
    return rows
