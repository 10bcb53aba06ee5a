"""Small models the course trains: an MLP, a CNN for 8x8 images, and a tiny GPT.

MLP         classifier for Blobs or flattened Digits
SmallCNN    two 3x3 convolutions and a linear head, for Digits (1, 8, 8)
GPT         a nanoGPT-style decoder: GPTEmbedding, a ModuleList of Blocks (pre-layernorm
            attention + feed-forward), a final LayerNorm and an lm_head. Later lessons shard it:
            data parallelism copies it whole, pipeline parallelism gives each stage a run of
            `blocks`, tensor parallelism splits the projections inside each Block by heads.

Taught in: lessons/03_pytorch_on_the_gpu.ipynb (and reused in lessons 05-08)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """in_features -> [Linear, ReLU, Dropout] x n_hidden -> out_features."""

    def __init__(self, in_features: int, out_features: int, hidden: int = 64, n_hidden: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        layers, width = [], in_features
        for _ in range(n_hidden):
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x):  # (B, in_features) -> (B, out_features)
        return self.net(x)


class SmallCNN(nn.Module):
    """Two 3x3 convolutions (padding keeps the size), a 2x2 max-pool and a linear classifier."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, image_size: int = 8,
                 width: int = 16, dropout: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width * (image_size // 2) ** 2, n_classes)

    def forward(self, x):  # (B, in_channels, H, W)
        x = F.relu(self.conv1(x))  # (B, width, H, W)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 2*width, H/2, W/2)
        return self.head(self.drop(x.flatten(1)))  # (B, n_classes)


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT."""

    vocab_size: int = 64  # number of distinct tokens
    block_size: int = 32  # longest context, in tokens (T <= block_size)
    n_layer: int = 2  # transformer Blocks
    n_head: int = 4  # attention heads per Block (n_embd must divide evenly)
    n_embd: int = 64  # channels C of the residual stream
    dropout: float = 0.0  # after embeddings, attention weights, and each residual branch


class GPTEmbedding(nn.Module):
    """Token embedding plus learned position embedding: ids (B, T) -> (B, T, C)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.block_size = config.block_size
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx):  # (B, T) token ids
        T = idx.size(1)
        if T > self.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        return self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C) + (T, C) -> (B, T, C)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which token t sees tokens 0..t only."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}")
        C = config.n_embd
        self.head_size = C // config.n_head
        # Separate q, k, v projections (nanoGPT fuses them into one c_attn): tensor parallelism
        # splits each one by output columns, i.e. by heads, with no interleaved layout to undo.
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(C, C) for _ in range(3))
        self.out_proj = nn.Linear(C, C)
        self.dropout = config.dropout
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x):  # (B, T, C)
        B, T, _ = x.shape
        # The number of heads is read from the projection's width, not stored: a tensor-parallel
        # shard holding n_head / tp_size heads runs this same code.
        q, k, v = (proj(x).view(B, T, -1, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(  # fused softmax(q k^T / sqrt(hs)) v, causal mask
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, hs) -> (B, T, nh*hs)
        return self.resid_drop(self.out_proj(y))  # (B, T, C)


class FeedForward(nn.Module):
    """Position-wise MLP: C -> 4C -> GELU -> C."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):  # (B, T, C)
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    """x + attn(ln(x)), then x + ff(ln(x)): pre-layernorm keeps the residual path clean."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.ff = FeedForward(config)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        x = x + self.attn(self.ln_1(x))
        return x + self.ff(self.ln_2(x))


class GPT(nn.Module):
    """ids (B, T) -> logits (B, T, vocab_size) for the next token at every position."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embed = GPTEmbedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        # Not tied to embed.wte (nanoGPT ties them): in pipeline parallelism the embedding and
        # the head live on different stages, and a shared weight would need its own all-reduce.
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "ff.proj.weight")):
                # GPT-2: each Block adds two branches to the residual stream; shrink their last
                # layer so the stream's variance does not grow with depth.
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):  # (B, T)
        x = self.embed(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab_size)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None):
        """Append `max_new_tokens` sampled tokens to idx (B, T); temperature 0 is greedy."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]  # (B, <=block_size)
            logits = self(context)[:, -1, :]  # only the last position predicts: (B, vocab)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)  # (B, T+1)
        return idx
