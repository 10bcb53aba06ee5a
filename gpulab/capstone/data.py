"""The capstone's data: token sequences with a rule to learn, each step's batch a function of
(seed, step) alone, so that a resumed run replays exactly the batches it would have seen.

    x, y = token_batch(config, step)                       # (B, T) ids and next-token targets
    x, y = rank_batch(config, step, dp_rank, dp_size, micro=0, n_micro=2)   # this rank's share

A sequence follows token[t+1] = (a * token[t] + b) mod vocab_size for a fixed (a, b), with one
token in 8 replaced by noise: a GPT learns the rule within a few dozen steps, so the loss falls
visibly, and it stays above zero.
"""

from __future__ import annotations

import torch

NOISE = 0.125  # share of tokens drawn at random


def token_batch(config, step: int):
    """The global batch of optimizer step `step`: x, y of shape (batch_size, seq_len)."""
    V, B, T = config.vocab_size, config.batch_size, config.seq_len
    rule = torch.Generator().manual_seed(config.seed)  # the same rule in every batch
    a = 2 * int(torch.randint(1, V // 2, (1,), generator=rule)) + 1  # odd: a permutation
    b = int(torch.randint(0, V, (1,), generator=rule))
    g = torch.Generator().manual_seed(config.seed * 1_000_003 + step + 1)
    tokens = torch.empty(B, T + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, V, (B,), generator=g)
    for t in range(T):
        tokens[:, t + 1] = (a * tokens[:, t] + b) % V
    noise = torch.rand(B, T + 1, generator=g) < NOISE
    tokens[noise] = torch.randint(0, V, (int(noise.sum()),), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # (B, T), (B, T)


def rank_batch(config, step: int, dp_rank: int, dp_size: int, micro: int = 0, n_micro: int = 1):
    """Microbatch `micro` of n_micro of this data-parallel rank's share of step `step`'s batch:
    (batch_size / dp_size / n_micro, seq_len) each. Ranks of one tensor-parallel group share a
    dp_rank, so they see the same tokens."""
    B = config.batch_size
    if B % (dp_size * n_micro):
        raise ValueError(f"batch_size {B} must divide by dp_size x n_micro = "
                         f"{dp_size} x {n_micro}")
    x, y = token_batch(config, step)
    per_rank, per_micro = B // dp_size, B // dp_size // n_micro
    start = dp_rank * per_rank + micro * per_micro
    return x[start:start + per_micro], y[start:start + per_micro]
