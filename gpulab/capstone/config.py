"""The capstone's model and run, sized by one config: a tiny GPT that trains on 4 CPU processes in
seconds, or one of hundreds of millions of parameters on GPUs, with the same code.

    config = capstone_config()                 # the runner's size: "tiny" on cpu, "gpt-400m" on gpu
    config = capstone_config("tiny", steps=8)  # any field can be overridden by name
    config.model                               # the GPTConfig that gpulab.models.GPT is built from
    config.n_params                            # parameters of that GPT

Taught in: the capstone, solutions/capstone_distributed_gpt
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpulab.memory.recipes import transformer_params
from gpulab.models import GPTConfig


@dataclass(frozen=True)
class CapstoneConfig:
    """A GPT's shape and the run that trains it."""

    name: str  # the preset it came from
    vocab_size: int  # distinct tokens
    seq_len: int  # T: tokens per sequence (the GPT's block_size)
    n_layer: int  # transformer Blocks
    n_head: int  # attention heads per Block
    n_embd: int  # C: channels of the residual stream
    batch_size: int  # sequences per optimizer step, over all data-parallel ranks (global)
    steps: int  # optimizer steps of one run
    lr: float  # AdamW's learning rate
    checkpoint_every: int  # steps between distributed checkpoints
    seed: int = 0  # weights and data are functions of it alone

    @property
    def model(self) -> GPTConfig:
        """The GPTConfig of the model (no dropout: runs compare step for step)."""
        return GPTConfig(vocab_size=self.vocab_size, block_size=self.seq_len,
                         n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                         dropout=0.0)

    @property
    def n_params(self) -> int:
        return transformer_params(self.n_layer, self.n_embd, self.vocab_size, self.seq_len)

    def __str__(self) -> str:
        return (f"{self.name}: GPT of {self.n_params / 1e6:.2f} M parameters ({self.n_layer} "
                f"Blocks, C={self.n_embd}, {self.n_head} heads, T={self.seq_len}, vocab "
                f"{self.vocab_size}); {self.steps} steps of {self.batch_size} sequences, "
                f"lr {self.lr:g}, a checkpoint every {self.checkpoint_every} steps")


PRESETS = {
    # ~0.9 M parameters: a step on 4 CPU processes takes a fraction of a second.
    "tiny": CapstoneConfig("tiny", vocab_size=256, seq_len=64, n_layer=4, n_head=4, n_embd=128,
                           batch_size=16, steps=12, lr=3e-3, checkpoint_every=4),
    # GPT-2 medium's shape, with an untied head: 406 M parameters, a GPU runner's size (on one
    # H100: 9.2 GiB at the peak with bf16, checkpointing and 8 microbatches of 4 sequences).
    "gpt-400m": CapstoneConfig("gpt-400m", vocab_size=50304, seq_len=1024, n_layer=24,
                               n_head=16, n_embd=1024, batch_size=32, steps=200, lr=3e-4,
                               checkpoint_every=50),
}


def capstone_config(size: str | None = None, **overrides) -> CapstoneConfig:
    """A preset by name ("tiny", "gpt-400m"; default: the runner's pick), fields overridden by
    keyword."""
    if size is None:
        import gpulab

        size = gpulab.runner.pick(cpu="tiny", gpu="gpt-400m")
    if size not in PRESETS:
        raise ValueError(f"unknown capstone size {size!r}; choose one of {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(CapstoneConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"CapstoneConfig has no field {', '.join(unknown)}; its fields are "
                        f"{', '.join(sorted(fields))}")
    config = dataclasses.replace(PRESETS[size], **overrides)
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}")
    if min(config.steps, config.batch_size, config.checkpoint_every) < 1:
        raise ValueError("steps, batch_size and checkpoint_every must be at least 1")
    return config
