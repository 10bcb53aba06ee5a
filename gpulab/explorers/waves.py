"""Launch-configuration and waves explorer: a 1-D launch over n elements, on one GPU.

    ex = waves_explorer()                  # 36,864 elements, 256 threads per block, A100 80GB
    ex.result.waves.utilization            # 144 blocks on 108 slots: 2 waves, 2/3 of slots busy
    ex.set(threads_per_block=128)          # 288 blocks: 2.67 waves, run as 3, 89% busy

blocks = ceil(n / threads_per_block), as a kernel launch computes it; the waves and the tail
come from gpulab.hardware.waves, the picture from gpulab.viz.plot_waves.
Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulab import hardware
from gpulab.explorers.base import Control, Explorer

THREADS_PER_BLOCK = (32, 64, 128, 256, 512, 1024)  # a warp up to CUDA's limit per block
MAX_GRID_X = 2**31 - 1  # CUDA's limit on gridDim.x
MAX_DRAWN_WAVES = 48  # past this, one row per wave is too thin to see: draw the saw tooth
MAX_DRAWN_BLOCKS = 200_000  # points on the saw tooth, at most


@dataclass(frozen=True)
class LaunchWaves:
    """A 1-D launch configuration and how its blocks fill the GPU."""

    gpu: hardware.GPUSpec
    n_elements: int  # one thread per element
    threads_per_block: int
    blocks: int  # ceil(n_elements / threads_per_block)
    idle_threads: int  # threads of the last block past n_elements (the `i < n` guard)
    waves: hardware.Waves  # blocks over SMs x blocks_per_sm slots


def launch_waves(gpu: str = "A100 80GB SXM", n_elements: int = 36864,
                 threads_per_block: int = 256, blocks_per_sm: int = 1) -> LaunchWaves:
    """The pure function behind the explorer: blocks of a 1-D launch and their waves.
    blocks_per_sm: blocks resident on one SM at once (set by occupancy: registers, shared
    memory and threads per SM)."""
    if threads_per_block not in THREADS_PER_BLOCK:
        raise ValueError(f"threads_per_block={threads_per_block}: use a multiple of the warp "
                         f"(32) up to 1024, one of {THREADS_PER_BLOCK}")
    spec = hardware.get_gpu(gpu)
    blocks = math.ceil(n_elements / threads_per_block)
    if blocks > MAX_GRID_X:
        raise ValueError(f"{blocks:,} blocks exceed CUDA's grid limit of {MAX_GRID_X:,} in x: "
                         "use more threads per block, or a grid-stride loop")
    return LaunchWaves(spec, n_elements, threads_per_block, blocks,
                       blocks * threads_per_block - n_elements,
                       hardware.waves(blocks, spec, blocks_per_sm))


def describe_launch(r: LaunchWaves) -> str:
    w = r.waves
    per_sm = w.slots // r.gpu.sms
    tail = ("every wave full" if w.tail_blocks == w.slots else
            f"last wave {w.tail_blocks} of {w.slots} slots busy")
    return "\n".join([
        f"n={r.n_elements:,} elements, {r.threads_per_block} threads per block: {r.blocks:,} "
        f"blocks ({r.idle_threads} idle threads in the last one)",
        f"{r.gpu.name}: {r.gpu.sms} SMs x {per_sm} resident block{'s' * (per_sm > 1)} per SM "
        f"= {w.slots} slots per wave",
        f"{w.waves:.3g} waves, run as {w.waves_ceil}; {tail}; {w.utilization:.1%} of the "
        "scheduled slots do work",
    ])


def draw_launch(r: LaunchWaves):
    from gpulab import viz

    blocks_per_sm = r.waves.slots // r.gpu.sms
    if r.waves.waves_ceil <= MAX_DRAWN_WAVES:
        return viz.plot_waves(r.blocks, r.gpu, blocks_per_sm)
    # Many waves: rows too thin to see, and the tail is a small share of the run. Draw the
    # utilization saw tooth instead, up to this grid (its first teeth only, for huge grids).
    max_blocks = min(r.blocks + r.waves.slots, MAX_DRAWN_BLOCKS)
    mark = (r.blocks,) if r.blocks <= max_blocks else ()
    return viz.plot_wave_utilization(r.gpu, max_blocks, blocks_per_sm, mark=mark)


def waves_explorer(interactive: bool | None = None, **values) -> Explorer:
    """GPU, problem size, threads per block and resident blocks per SM -> blocks, waves, tail.
    values: start values of the controls (gpu, n_elements, threads_per_block, blocks_per_sm)."""
    controls = [
        Control("gpu", "GPU", "A100 80GB SXM", tuple(hardware.list_gpus())),
        Control("n_elements", "elements (n)", 36864, kind="number"),
        Control("threads_per_block", "threads per block", 256, THREADS_PER_BLOCK),
        Control("blocks_per_sm", "resident blocks per SM", 1, (1, 16), kind="slider"),
    ]
    return Explorer("Launch configuration and waves", controls, launch_waves, describe_launch,
                    draw_launch, values, interactive)
