"""Pictures for the lessons: rooflines and waves.

Each function builds a matplotlib Figure without pyplot (so it holds no global figure state and
draws headlessly) and returns it; a notebook shows it as the cell's value. Import this module
where you draw: `import gpulab` never loads matplotlib.

    from gpulab import viz
    viz.plot_roofline(["A100 80GB SXM", "H100 SXM"], "bf16", ops=[("matmul 4096", 1365, None)])
    viz.plot_waves(144, "A100 80GB SXM")

Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from gpulab import hardware

DPI = 90  # modest: lesson notebooks are committed with their pictures


def _roofs(gpus) -> list:
    """One roof or several, each a GPUSpec, a MeasuredRoofline or a spec-sheet name."""
    if isinstance(gpus, (str, hardware.GPUSpec, hardware.MeasuredRoofline)):
        gpus = [gpus]
    return [hardware.get_gpu(g) if isinstance(g, str) else g for g in gpus]


def plot_roofline(gpus, dtype: str = "bf16", ops=(), intensity_range=(0.1, 2000),
                  title: str | None = None, figsize=(7.5, 4.6)) -> Figure:
    """Log-log roofline of each GPU in `dtype`, with ops placed on it.

    ops: (label, intensity in FLOP/byte, achieved TFLOP/s or None) triples. Each op gets a
    dotted vertical line at its intensity; a measured op also gets a star at what it achieved.
    Measured rooflines (MeasuredRoofline) are drawn dashed.
    """
    roofs = _roofs(gpus)
    lo, hi = intensity_range
    x = np.logspace(np.log10(lo), np.log10(hi), 256)  # (256,) FLOP/byte
    fig = Figure(figsize=figsize, dpi=DPI)
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    for roof in roofs:
        peak = roof.peak_tflops(dtype)
        style = "--" if getattr(roof, "measured", False) else "-"
        label = f"{roof.name}: {peak:.4g} TFLOP/s, {roof.bandwidth_gbps:.4g} GB/s"
        (line,) = ax.plot(x, hardware.attainable_tflops(roof, dtype, x), style, lw=2,
                          label=label)
        ridge = hardware.ops_per_byte(roof, dtype)
        if lo <= ridge <= hi:  # the knee: left of it memory-bound, right of it compute-bound
            ax.scatter([ridge], [peak], s=25, color=line.get_color(), zorder=3)
    bottom = min(hardware.attainable_tflops(r, dtype, lo) for r in roofs)
    level, previous = 0, None
    for label, intensity, achieved in sorted(ops, key=lambda op: op[1]):
        # Labels of ops closer than 1.5x in intensity would overlap: stagger them upwards.
        level = level + 1 if previous and intensity < 1.5 * previous else 0
        previous = intensity
        ax.axvline(intensity, color="0.45", ls=":", lw=1)
        ax.annotate(label, (intensity, bottom), xytext=(3, 3 + 55 * (level % 3)), rotation=90,
                    textcoords="offset points", fontsize=8, color="0.25", va="bottom")
        if achieved is not None:
            ax.scatter([intensity], [achieved], marker="*", s=140, color="crimson", zorder=4)
            bottom = min(bottom, achieved)
    ax.set_ylim(bottom / 2, None)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel(f"attainable {hardware.dtype_key(dtype)} TFLOP/s")
    ax.set_title(title or f"Roofline, {hardware.dtype_key(dtype)} (dense peaks)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    return fig


def waves_grid(n_blocks: int, slots: int):
    """(waves_ceil, slots) array: 1 where a block runs in that wave and slot, 0 where idle.
    Blocks fill wave 0's slots first, then wave 1's, ... as the block scheduler hands them out."""
    waves_ceil = -(-n_blocks // slots)
    return (np.arange(waves_ceil * slots) < n_blocks).astype(np.int8).reshape(waves_ceil, slots)


def plot_waves(n_blocks: int, gpu, blocks_per_sm: int = 1, figsize=(7.5, 2.6)) -> Figure:
    """Every SM slot in every wave, busy or idle: the partly empty last row is the tail effect."""
    spec = _roofs(gpu)[0]
    w = hardware.waves(n_blocks, spec, blocks_per_sm)
    grid = waves_grid(n_blocks, w.slots)  # (waves_ceil, slots)
    fig = Figure(figsize=figsize, dpi=DPI)
    ax = fig.subplots()
    ax.imshow(grid, cmap=ListedColormap(["#e6e6e6", "#4c72b0"]), vmin=0, vmax=1,
              aspect="auto", interpolation="nearest")
    if w.waves_ceil <= 12:  # beyond that, rows are too thin to label
        ax.set_yticks(range(w.waves_ceil), [f"wave {i + 1}" for i in range(w.waves_ceil)])
    else:
        ax.set_ylabel("wave")
    if w.tail_blocks < w.slots:
        ax.annotate(f"idle: {w.slots - w.tail_blocks} slots", (w.tail_blocks - 0.5,
                    w.waves_ceil - 1), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=9)
    ax.set_xlabel(f"slot ({spec.sms} SMs x {blocks_per_sm} block{'s' * (blocks_per_sm > 1)} "
                  "per SM)")
    ax.set_title(f"{n_blocks} blocks on {spec.name}: {w.waves:.2f} waves, run as "
                 f"{w.waves_ceil}; {w.utilization:.0%} of slots busy", fontsize=10)
    fig.tight_layout()
    return fig


def plot_wave_utilization(gpu, max_blocks: int, blocks_per_sm: int = 1, mark=(),
                          figsize=(7.5, 2.8)) -> Figure:
    """Utilization against grid size: a saw tooth, 100% at each whole number of waves and
    dropping just past it. `mark`: grid sizes to point out."""
    spec = _roofs(gpu)[0]
    n = np.arange(1, max_blocks + 1)  # (max_blocks,)
    slots = spec.sms * blocks_per_sm
    utilization = n / (np.ceil(n / slots) * slots)
    fig = Figure(figsize=figsize, dpi=DPI)
    ax = fig.subplots()
    ax.plot(n, utilization, lw=1.2)
    for m in mark:
        u = hardware.waves(m, spec, blocks_per_sm).utilization
        ax.scatter([m], [u], color="crimson", zorder=3)
        ax.annotate(f"{m} blocks: {u:.0%}", (m, u), xytext=(4, -12), textcoords="offset points",
                    fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("blocks in the grid")
    ax.set_ylabel("slot utilization")
    ax.set_title(f"Tail effect on {spec.name} ({slots} slots per wave)", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_memory_hierarchy(gpu, figsize=(7.5, 2.6)) -> Figure:
    """Capacity of each level, whole GPU, log scale: registers, L1/shared, L2, device memory.
    Each level down is bigger and slower; the fast ones are spread over the SMs."""
    spec = _roofs(gpu)[0]
    regs = spec.registers_per_sm_kb * 2**10 * spec.sms
    l1 = spec.l1_smem_per_sm_kb * 2**10 * spec.sms
    levels = [  # (label, bytes, as written)
        (f"registers\n{spec.registers_per_sm_kb} KB x {spec.sms} SMs", regs, _mb(regs)),
        (f"L1 + shared\n{spec.l1_smem_per_sm_kb} KB x {spec.sms} SMs", l1, _mb(l1)),
        ("L2 cache\n(one, shared by all SMs)", spec.l2_mb * 2**20, f"{spec.l2_mb:g} MB"),
        (f"{spec.memory_type}\n(device memory)", spec.memory_gb * 1e9, f"{spec.memory_gb:g} GB"),
    ]
    fig = Figure(figsize=figsize, dpi=DPI)
    ax = fig.subplots()
    labels, sizes, texts = zip(*levels, strict=True)
    bars = ax.barh(range(len(levels)), sizes, color=["#4c72b0", "#55a868", "#c44e52", "#8172b2"])
    ax.set_yticks(range(len(levels)), labels, fontsize=8)
    ax.invert_yaxis()  # fastest on top
    ax.set_xscale("log")
    for bar, size, text in zip(bars, sizes, texts, strict=True):
        ax.annotate(text, (size, bar.get_y() + bar.get_height() / 2), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xlim(2**20, max(sizes) * 10)
    ax.set_xlabel("capacity, whole GPU (bytes)")
    ax.set_title(f"Memory hierarchy of the {spec.name}: faster at the top", fontsize=10)
    fig.tight_layout()
    return fig


def _mb(n_bytes: float) -> str:
    """Bytes as binary megabytes, the unit caches and register files are sized in."""
    return f"{n_bytes / 2**20:.3g} MB"


def plot_time_vs_size(n_bytes, seconds, bandwidth_gbps: float | None = None,
                      label: str = "measured", figsize=(7.5, 3.4)) -> Figure:
    """Run time against bytes moved, log-log. Small sizes sit on a flat floor (overhead-bound:
    the time does not depend on the work); large ones climb along bytes / bandwidth
    (memory-bound). With `bandwidth_gbps`, that memory roof is drawn too."""
    n_bytes, seconds = np.asarray(n_bytes, float), np.asarray(seconds, float)
    fig = Figure(figsize=figsize, dpi=DPI)
    ax = fig.subplots()
    ax.plot(n_bytes, seconds, "o-", label=label)
    if bandwidth_gbps:
        ax.plot(n_bytes, n_bytes / (bandwidth_gbps * 1e9), "--", color="0.4",
                label=f"bytes / {bandwidth_gbps:.3g} GB/s (memory roof)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes moved per call")
    ax.set_ylabel("seconds per call")
    ax.set_title("Overhead-bound on the left, memory-bound on the right", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
