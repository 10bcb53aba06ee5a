"""What the CUDA caching allocator holds: allocated vs reserved, fragmentation, retries.

    state = allocator_state()          # after some training on a GPU
    state.allocated_bytes              # in live tensors (what the estimate and measure count)
    state.reserved_bytes               # taken from the driver: allocated + cached free blocks
    state.fragmentation                # the share of reserved memory that holds no tensor

PyTorch does not return freed GPU memory to the driver (cudaFree synchronizes the device): it
keeps the blocks and reuses them for later tensors of a fitting size. nvidia-smi therefore shows
the reserved figure, not the allocated one. When a request fits in no cached block and the
driver has nothing left, the allocator frees its unused cached blocks, retries
(num_alloc_retries counts these slow paths), and only then raises torch.OutOfMemoryError. Free
blocks too small or too scattered to serve a large request are fragmentation: the OOM message's
"reserved by PyTorch but unallocated"; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets
segments grow instead. GPU only: the CPU runner has no caching allocator to ask.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AllocatorState:
    """torch.cuda.memory_stats(), the lines a person reads first."""

    allocated_bytes: int  # in tensors now
    reserved_bytes: int  # held from the driver now (allocated + cached)
    peak_allocated_bytes: int  # since the last reset_peak_memory_stats()
    peak_reserved_bytes: int
    inactive_split_bytes: int  # free pieces of split blocks: the fragmentation that hurts
    num_alloc_retries: int  # allocations that had to free the cache and retry
    num_ooms: int  # out-of-memory errors raised

    @property
    def fragmentation(self) -> float:
        """Share of reserved memory not holding a tensor (0 when nothing is reserved)."""
        return 1 - self.allocated_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    def __str__(self) -> str:
        mib = 2**20
        return (f"allocated {self.allocated_bytes / mib:.1f} MiB (peak "
                f"{self.peak_allocated_bytes / mib:.1f}), reserved "
                f"{self.reserved_bytes / mib:.1f} MiB (peak {self.peak_reserved_bytes / mib:.1f}),"
                f" {self.fragmentation:.0%} of reserved unallocated, "
                f"{self.num_alloc_retries} retries, {self.num_ooms} OOMs")


def allocator_state(device=None) -> AllocatorState:
    """The caching allocator's figures for `device` (default: the current CUDA device)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the caching allocator is CUDA's: this machine has no usable GPU. "
                           "On the cpu runner, gpulab.memory.MemoryTracker counts tensors.")
    stats = torch.cuda.memory_stats(device)
    return AllocatorState(
        allocated_bytes=stats.get("allocated_bytes.all.current", 0),
        reserved_bytes=stats.get("reserved_bytes.all.current", 0),
        peak_allocated_bytes=stats.get("allocated_bytes.all.peak", 0),
        peak_reserved_bytes=stats.get("reserved_bytes.all.peak", 0),
        inactive_split_bytes=stats.get("inactive_split_bytes.all.current", 0),
        num_alloc_retries=stats.get("num_alloc_retries", 0),
        num_ooms=stats.get("num_ooms", 0),
    )
