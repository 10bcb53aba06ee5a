"""Estimate the memory of a training step on paper, before running it.

    est = estimate_memory(MLP(64, 10), batch_size=256, optimizer="adam")
    est.peak_bytes                 # the most bytes live at once during the step
    print(est.table())             # napkin sum and the breakdown at the peak, by category
    est.plot()                     # the same as bars
    estimate_transformer(n_layer=32, n_embd=4096, n_head=32, seq_len=2048, batch_size=1,
                         vocab_size=32000, precision="mixed", zero_stage=3, world_size=8)

Two answers, one coarse and one fine:

  napkin   parameters + gradients + optimizer state + activations saved for backward + batch:
           the sum everyone writes first (bytes per parameter from gpulab.memory.recipes,
           activations from what each layer saves: gpulab.memory.paper_models). An upper
           bound, because gradients appear only as backward frees activations.
  peak     the step replayed tensor by tensor (gpulab.memory.timeline): forward, backward in
           reverse, the optimizer's update; the most bytes live at once, and what they were.
           This is what a device must hold, and what gpulab.memory.measure compares against
           (within 5% on the course's models, tested).

The step is the steady state that gpulab.train runs: zero_grad(set_to_none=True), forward and
loss (under autocast for a mixed-precision recipe), backward, optimizer.step(), with the
optimizer's state already there from the step before. batch_size is per rank. With ZeRO
(zero_stage 1-3 over world_size ranks) each rank keeps its shard of the model states, as in
zero_memory_table; stage 3 also holds one Block's gathered parameters while it runs (an
approximation: FSDP prefetches the next one too). checkpointing=True re-runs each GPT Block in
backward (torch.utils.checkpoint), as gpulab.memory.checkpointing.checkpoint_blocks does.
On CUDA every tensor is rounded up to 512 bytes; workspaces of cuBLAS and attention kernels are
not modelled (measure reports them as untracked bytes).
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulab.distributed.zero import MemoryRow
from gpulab.memory.breakdown import MemoryBreakdown, format_bytes, plot_breakdowns
from gpulab.memory.paper_models import PaperForward, cnn_forward, gpt_forward, mlp_forward
from gpulab.memory.recipes import (
    model_states,
    optimizer_itemsizes,
    optimizer_kind,
    recipe,
)
from gpulab.memory.timeline import PaperStep
from gpulab.memory.tracker import plot_timeline


@dataclass(frozen=True)
class MemoryEstimate:
    """One training step's memory on paper."""

    model: str  # "MLP", "SmallCNN", "GPT"
    n_params: int
    batch_size: int  # per rank
    precision: str  # a name in gpulab.memory.recipes.RECIPES
    optimizer: str  # "sgd", "sgd-momentum", "adam", "adamw"
    device_type: str  # "cpu" or "cuda" (512-byte rounding, foreach optimizers)
    zero_stage: int
    world_size: int
    checkpointing: bool
    napkin: MemoryBreakdown  # params + grads + state + activations saved for backward + batch
    peak: MemoryBreakdown  # what was live at the peak of the step, by category
    peak_phase: str  # "forward", "backward" or "optimizer"
    timeline: tuple = ()  # (phase, live bytes) after each allocation and free on paper

    @property
    def peak_bytes(self) -> int:
        return self.peak.total

    def model_states(self) -> MemoryRow:
        """Parameters, gradients and optimizer state per rank, as zero_memory_table has them."""
        return model_states(self.n_params, self.precision, self.optimizer, self.zero_stage,
                            self.world_size)

    def fits_on(self, gpu, context_bytes: int = 512 * 2**20) -> bool:
        """Whether the peak fits in a GPU's memory (a GPUSpec or a name from gpulab.hardware),
        leaving context_bytes for the CUDA context and kernels (a few hundred MiB)."""
        from gpulab.hardware import get_gpu

        spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
        # Datasheets say GB, but the cards hold about that many GiB: an H100 80GB reports
        # 81,559 MiB (79.6 GiB) to nvidia-smi, far more than 80e9 bytes.
        return self.peak_bytes + context_bytes <= spec.memory_gb * 2**30

    def table(self) -> str:
        """Napkin sum and peak breakdown side by side, in MiB."""
        head = (f"{self.model}, {self.n_params:,} parameters, batch {self.batch_size}, "
                f"{self.precision}, {self.optimizer}, {self.device_type}"
                + (f", ZeRO-{self.zero_stage} x{self.world_size}" if self.zero_stage else "")
                + (", checkpointing" if self.checkpointing else ""))
        lines = [head, f"{'category':<12} {'napkin MiB':>11} {'at peak MiB':>12}", "-" * 37]
        for name, nbytes in self.napkin.as_dict().items():
            lines.append(f"{name:<12} {nbytes / 2**20:>11.3f} "
                         f"{getattr(self.peak, name) / 2**20:>12.3f}")
        lines.append(f"{'total':<12} {self.napkin.total / 2**20:>11.3f} "
                     f"{self.peak.total / 2**20:>12.3f}")
        lines.append(f"peak {format_bytes(self.peak_bytes)} during {self.peak_phase}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, ax=None):
        """The napkin sum and the peak as stacked bars (matplotlib); returns the Axes."""
        return plot_breakdowns({"napkin sum": self.napkin, "at the peak": self.peak}, ax=ax)

    def plot_timeline(self, ax=None, label: str | None = "estimate"):
        """Live MiB through the step on paper, coloured by phase. Draw a Measurement's
        plot_timeline on the same `ax` to compare: x runs from 0 to 1 for both (the event counts
        differ a little: the tracker sees one event per op, the paper one per tensor)."""
        return plot_timeline(list(self.timeline), ax=ax, label=label)


def estimate_memory(model, batch_size: int, *, seq_len: int | None = None, optimizer="adam",
                    precision=None, device_type: str | None = None, zero_stage: int = 0,
                    world_size: int = 1, checkpointing: bool = False) -> MemoryEstimate:
    """The memory of one training step of `model` (an MLP, SmallCNN, GPT or GPTConfig from
    gpulab.models; only its shape is read) on batches of batch_size (GPT: of seq_len tokens,
    default block_size). optimizer: "sgd", "sgd-momentum", "adam", "adamw" or a torch optimizer.
    precision: a recipe name (gpulab.memory.recipes), an AutocastRecipe or True (the runner's:
    gpulab.runner.autocast), or None for fp32. device_type: "cpu" or "cuda"; default: where the
    model's parameters are (a GPTConfig: the runner's device)."""
    from gpulab.models import GPT, MLP, GPTConfig, SmallCNN

    if device_type is None:
        device_type = _device_type_of(model)
    if precision is True:
        import gpulab

        precision = gpulab.runner.autocast
    r, kind = recipe(precision), optimizer_kind(optimizer)
    if zero_stage and world_size < 2:
        raise ValueError("ZeRO shards over data-parallel ranks: pass world_size >= 2")
    ws = world_size
    # The optimizer's state was made by the previous step: it is there before this one starts.
    step = PaperStep(device_type, optimizer_itemsizes(r, kind),
                     4 if kind in ("adam", "adamw") and device_type != "cuda" else 0,
                     param_shards=ws if zero_stage >= 3 else 1,
                     grad_shards=ws if zero_stage >= 2 else 1,
                     optimizer_shards=ws if zero_stage >= 1 else 1)
    f = PaperForward(step, r)
    gathered = None
    if isinstance(model, GPT | GPTConfig):
        config = model.config if isinstance(model, GPT) else model
        if config.dropout:
            raise ValueError("the estimate models GPTs with dropout=0 (what the course trains):"
                             " with dropout, attention falls back to kernels that keep T x T")
        T = seq_len or config.block_size
        if T > config.block_size:
            raise ValueError(f"seq_len {T} is longer than block_size {config.block_size}")
        block = 12 * config.n_embd**2 + 13 * config.n_embd
        loss, logits, gathered = gpt_forward(
            f, batch_size, T, config, checkpointing,
            gathered_block_bytes=block * r.param_itemsize if zero_stage >= 3 else 0)
        name = "GPT"
    elif checkpointing:
        raise ValueError("checkpointing is modelled for the GPT's Blocks only")
    elif isinstance(model, MLP):
        loss, logits = mlp_forward(f, batch_size, _mlp_layers(model))
        name = "MLP"
    elif isinstance(model, SmallCNN):
        loss, logits = cnn_forward(f, batch_size, *_cnn_shape(model))
        name = "SmallCNN"
    else:
        raise TypeError(f"no paper model for {type(model).__name__}: estimate_memory knows "
                        "MLP, SmallCNN and GPT; use gpulab.memory.measure_step for others")
    step.release(logits)  # `loss_fn(model(x), y)`: the logits go when the loss is made
    if r.autocast:
        step.end_autocast()
    step.backward(loss)
    if gathered is not None:
        step.release(gathered)
    step.optimizer_step(kind, fused=r.master_weights)  # mixed precision: fused Adam kernels
    n_params = sum(p.numel for p in step.params)
    states = model_states(n_params, r, kind, zero_stage, ws)
    napkin = MemoryBreakdown(parameters=states.param_bytes, gradients=states.grad_bytes,
                             optimizer=states.optimizer_state_bytes,
                             activations=step.saved_at_end_of_forward,
                             other=step.bytes["other"])
    return MemoryEstimate(name, n_params, batch_size, r.name, kind, device_type, zero_stage,
                          ws, checkpointing, napkin, step.peak_breakdown, step.peak_phase,
                          tuple(step.timeline))


def estimate_transformer(n_layer: int, n_embd: int, n_head: int, seq_len: int,
                         batch_size: int, vocab_size: int = 50257, **kwargs) -> MemoryEstimate:
    """estimate_memory for a GPT of this shape (the course's architecture: learned positions,
    4x feed-forward with GELU, untied head), without building it. kwargs as estimate_memory."""
    from gpulab.models import GPTConfig

    config = GPTConfig(vocab_size=vocab_size, block_size=seq_len, n_layer=n_layer,
                       n_head=n_head, n_embd=n_embd)
    return estimate_memory(config, batch_size, seq_len=seq_len, **kwargs)


def _device_type_of(model) -> str:
    first = next(model.parameters(), None) if hasattr(model, "parameters") else None
    if first is not None:
        return first.device.type
    import gpulab

    return gpulab.runner.device_kind


def _mlp_layers(model) -> list:
    from torch import nn

    layers = []
    for m in model.net:
        if isinstance(m, nn.Linear):
            layers.append(("linear", m.in_features, m.out_features))
        elif isinstance(m, nn.ReLU):
            layers.append(("relu",))
        elif isinstance(m, nn.Dropout):
            layers.append(("dropout", m.p))
        else:
            raise TypeError(f"no paper layer for {type(m).__name__}")
    return layers


def _cnn_shape(model) -> tuple:
    width = model.conv1.out_channels
    image_size = 2 * math.isqrt(model.head.in_features // (2 * width))
    return (model.conv1.in_channels, width, image_size, model.head.out_features, model.drop.p)
