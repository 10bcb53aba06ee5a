"""Measuring a rank: its peak memory during one training step, and what shard_model made of the
model (is it sharded, in which dtype does it compute, is each Block checkpointed).

    meter = PeakMeter(model, optimizer, device)
    with meter:
        one_training_step()
    meter.peak_bytes, meter.by_kind        # e.g. 11_159_580, {"Sharded Param": ..., ...}

On CUDA the peak is the caching allocator's (torch.cuda.max_memory_allocated), what an OOM is
decided against. On the CPU, gpulab.memory.MemoryTracker cannot count FSDP2: FSDP frees a
gathered parameter by resizing its storage to zero in place, which a dispatch mode never sees.
torch's own FSDPMemTracker (torch.distributed._tools.fsdp2_mem_tracker) hooks into FSDP2's
all-gathers and reduce-scatters and counts sharded and gathered parameters, gradients, optimizer
state, activations and communication buffers apart: its peak is what this rank held at most.
A model that is not an FSDPModule is measured with its parent, MemTracker.
Taught in: lessons/07_gpu_memory.ipynb (estimate vs measure); the capstone
"""

from __future__ import annotations

import torch


class PeakMeter:
    """The peak bytes this rank holds inside the `with` block (see the module)."""

    def __init__(self, model, optimizer, device):
        self.model, self.optimizer, self.device = model, optimizer, torch.device(device)
        self.peak_bytes: int | None = None  # None until a `with` block has run
        self.by_kind: dict[str, int] = {}
        self._tracker = None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed._tools.mem_tracker import MemTracker
        from torch.distributed.fsdp import FSDPModule

        if isinstance(self.model, FSDPModule):
            self._tracker = FSDPMemTracker(self.model, self.optimizer)
        else:
            self._tracker = MemTracker()
            self._tracker.track_external(self.model, self.optimizer)
        self._tracker.__enter__()
        return self

    def next_microbatch(self) -> None:
        """Call before each microbatch's forward: FSDPMemTracker refuses a second forward of
        the same module unless its per-module stats are cleared (its peak is kept)."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
            self.by_kind = {"Total": self.peak_bytes}
            return
        self._tracker.__exit__(*exc)
        snapshot = self._tracker.get_tracker_snapshot("peak").get(self.device, {})
        self.by_kind = {str(getattr(kind, "value", kind)): int(n)
                        for kind, n in snapshot.items()}
        self.peak_bytes = self.by_kind.get("Total", 0)
        self._tracker = None


def describe_model(model) -> dict:
    """What the checker reads about a sharded model, as plain values: whether the root and each
    Block are FSDPModules (each its own all-gather unit), the dtype FSDP gathers weights in, the
    bytes of parameters this rank holds against the whole model's, and which Blocks run under
    activation checkpointing."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from gpulab.memory import is_checkpointed

    blocks = list(getattr(model, "blocks", []))
    local = full = 0
    for p in model.parameters():
        local += (p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
        full += p.numel() * p.element_size()
    param_dtype = None
    if isinstance(model, FSDPModule):
        policy = getattr(model._get_fsdp_state(), "_mp_policy", None)  # noqa: SLF001
        dtype = getattr(policy, "param_dtype", None)
        param_dtype = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    tp = [isinstance(getattr(getattr(b, "attn", None), "q_proj", None), torch.nn.Module)
          and isinstance(b.attn.q_proj.weight, DTensor)
          and "tp" in (b.attn.q_proj.weight.device_mesh.mesh_dim_names or ())
          for b in blocks]
    return {"type": type(model).__name__, "fsdp_root": isinstance(model, FSDPModule),
            "fsdp_blocks": [isinstance(b, FSDPModule) for b in blocks],
            "checkpointed_blocks": [_checkpointed(b, is_checkpointed) for b in blocks],
            "tp_blocks": tp, "param_dtype": param_dtype,
            "local_param_bytes": local, "full_param_bytes": full}


def _checkpointed(block, is_checkpointed) -> bool:
    """gpulab.memory.checkpoint_blocks, or torch's checkpoint_wrapper around the Block's parts."""
    if is_checkpointed(block):
        return True
    return any(type(m).__name__ == "CheckpointWrapper" for m in block.modules())
