"""A GPT cut into pipeline stages: the embedding and the first Blocks, then Blocks, then the
last Blocks with the final norm and the head.

    stages = split_gpt(gpt, 4)           # 4 GPTStage modules, copies of gpt's parameters
    x = ids                              # (B, T)
    for stage in stages:
        x = stage(x)                     # (B, T) -> (B, T, C) -> ... -> (B, T, vocab_size)
    # x equals gpt(ids) exactly: the same operations in the same order

stage_layers(n_layer, n_stages)   which Blocks each stage holds: contiguous runs whose lengths
                                  differ by at most one, the longer runs first
GPTStage                          one stage; its parameter names are the GPT's own
                                  ("blocks.2.attn.q_proj.weight"), so a stage's gradients and
                                  state dict line up with the whole model's by name

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import copy

from torch import nn


class GPTStage(nn.Module):
    """(embed) -> a run of Blocks -> (ln_f, lm_head). The first stage takes token ids (B, T),
    the others (B, T, C); the last returns logits (B, T, vocab_size), the others (B, T, C)."""

    def __init__(self, blocks: dict[int, nn.Module], embed: nn.Module | None = None,
                 ln_f: nn.Module | None = None, lm_head: nn.Module | None = None):
        super().__init__()
        if (ln_f is None) != (lm_head is None):
            raise ValueError("the last stage needs both ln_f and lm_head (or neither)")
        self.embed = embed
        # Keyed by the Block's index in the whole GPT, so names read "blocks.2....": the same
        # name a parameter has in the unsplit model.
        self.blocks = nn.ModuleDict({str(i): block for i, block in blocks.items()})
        self.ln_f = ln_f
        self.lm_head = lm_head

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)  # (B, T) ids -> (B, T, C)
        for block in self.blocks.values():
            x = block(x)  # (B, T, C)
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
        return x


def stage_layers(n_layer: int, n_stages: int) -> list[range]:
    """The Blocks of each stage: n_layer // n_stages each, one more for the first
    n_layer % n_stages stages. (The embedding is a cheap lookup; the head is a matmul as wide
    as the vocabulary, so a real split may give the last stage fewer Blocks: this one only
    counts Blocks.)"""
    for what, value in (("n_layer", n_layer), ("n_stages", n_stages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    if n_stages > n_layer:
        raise ValueError(f"n_stages={n_stages} is more than the model's n_layer={n_layer} "
                         "Blocks: every stage needs at least one Block")
    base, extra = divmod(n_layer, n_stages)
    ranges, first = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        ranges.append(range(first, first + size))
        first += size
    return ranges


def split_gpt(gpt: nn.Module, n_stages: int) -> list[GPTStage]:
    """gpt (a gpulab.models.GPT) as n_stages GPTStage modules that hold deep copies of its
    parameters: the stages share no tensor with gpt, which stays a single-process reference.
    Composed in order, they compute exactly gpt's forward."""
    ranges = stage_layers(len(gpt.blocks), n_stages)
    stages = []
    for s, layers in enumerate(ranges):
        last = s == n_stages - 1
        stages.append(GPTStage(
            {i: copy.deepcopy(gpt.blocks[i]) for i in layers},
            embed=copy.deepcopy(gpt.embed) if s == 0 else None,
            ln_f=copy.deepcopy(gpt.ln_f) if last else None,
            lm_head=copy.deepcopy(gpt.lm_head) if last else None))
    return stages
