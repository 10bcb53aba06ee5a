"""A parallel plan, chosen before running: how the ranks of a cluster split the work, in which
precision, and what it may cost in memory.

    plan = ParallelPlan(dp_size=4, tp_size=1, precision="bf16", activation_checkpointing=False,
                        grad_accum_steps=2, budget_bytes=64 * 2**20)
    plan.check(world_size=4, procs_per_node=2, config=config)   # a clear error if it cannot run
    mesh = make_mesh(plan)            # DeviceMesh (dp_size, tp_size), axes named "dp" and "tp"
    plan.param_dtype                  # torch.bfloat16: what FSDP2 gathers the weights in

The mesh is laid out as torchrun numbers ranks: a node's ranks are contiguous and "tp" varies
fastest, so a tensor-parallel group never leaves a node (its all-reduces stay on the fast link)
and the data-parallel axis ("dp": FSDP2's all-gathers and reduce-scatters) crosses the nodes.
Taught in: lessons/05 (FSDP2), 06 (device meshes), 07 (memory); the capstone
"""

from __future__ import annotations

from dataclasses import dataclass

PRECISIONS = ("bf16", "fp16", "fp32")  # the weights' dtype while FSDP2 has them gathered


@dataclass(frozen=True)
class ParallelPlan:
    """How a training run uses its ranks, and the memory it may take on each."""

    dp_size: int  # data-parallel ranks: FSDP2 shards parameters, gradients and AdamW state
    tp_size: int = 1  # tensor-parallel ranks inside a node (1: no tensor parallelism)
    precision: str = "bf16"  # "bf16" (CPU, Ampere+), "fp16" (GPU, with a GradScaler), "fp32"
    activation_checkpointing: bool = False  # recompute each Block's activations in backward
    grad_accum_steps: int = 1  # microbatches per optimizer step
    budget_bytes: int = 2**30  # what one rank may hold at its peak

    @property
    def world_size(self) -> int:
        return self.dp_size * self.tp_size

    @property
    def param_dtype(self):
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
            self.precision]

    def micro_batch_size(self, config) -> int:
        """Sequences in one rank's microbatch."""
        return config.batch_size // self.dp_size // self.grad_accum_steps

    def check(self, world_size: int, procs_per_node: int, config) -> None:
        """Raise ValueError, saying what to change, if this plan cannot run on world_size ranks
        (procs_per_node per node) with this CapstoneConfig."""
        problems = []
        for name in ("dp_size", "tp_size", "grad_accum_steps", "budget_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be an int >= 1, got {value!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {', '.join(PRECISIONS)}, got "
                            f"{self.precision!r}")
        if problems:
            raise ValueError("; ".join(problems))
        if self.world_size != world_size:
            problems.append(f"dp_size x tp_size = {self.dp_size} x {self.tp_size} = "
                            f"{self.world_size}, but the cluster has {world_size} ranks: use "
                            "them all")
        if procs_per_node % self.tp_size:
            problems.append(f"tp_size {self.tp_size} must divide the {procs_per_node} processes "
                            "of a node: a tensor-parallel group stays inside one node")
        if config.n_head % self.tp_size:
            problems.append(f"tp_size {self.tp_size} must divide n_head {config.n_head}: each "
                            "rank computes whole attention heads")
        if config.batch_size % (self.dp_size * self.grad_accum_steps):
            problems.append(f"batch_size {config.batch_size} must divide by dp_size x "
                            f"grad_accum_steps = {self.dp_size} x {self.grad_accum_steps}")
        if problems:
            raise ValueError("this plan cannot run: " + "; ".join(problems))

    def __str__(self) -> str:
        from gpulab.memory import format_bytes

        return (f"dp_size={self.dp_size} (FSDP2) x tp_size={self.tp_size}, {self.precision}, "
                f"activation checkpointing {'on' if self.activation_checkpointing else 'off'}, "
                f"{self.grad_accum_steps} microbatch(es) per step, budget "
                f"{format_bytes(self.budget_bytes)} per rank")


def make_mesh(plan: ParallelPlan, device_type: str | None = None):
    """The (dp_size, tp_size) DeviceMesh with axes "dp" and "tp", over every rank of the job
    (the process group must be up). device_type: "cpu" (gloo) or "cuda" (nccl); default: the
    runner's."""
    from torch.distributed.device_mesh import init_device_mesh

    if device_type is None:
        import gpulab

        device_type = "cuda" if gpulab.runner.device_kind == "cuda" else "cpu"
    return init_device_mesh(device_type, (plan.dp_size, plan.tp_size),
                            mesh_dim_names=("dp", "tp"))
