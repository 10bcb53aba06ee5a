"""gpulab.models: shapes, causal attention equal to a hand-written reference, and GPT parts that
later lessons run one by one (pipeline stages) or split by heads (tensor parallelism)."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpulab import models

CONFIG = models.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=32)


def make_gpt(config=CONFIG, seed=0):
    torch.manual_seed(seed)
    return models.GPT(config).eval()


def test_mlp_and_cnn_shapes():
    torch.manual_seed(0)
    assert models.MLP(2, 3, hidden=16, n_hidden=3)(torch.randn(5, 2)).shape == (5, 3)
    assert models.SmallCNN()(torch.randn(4, 1, 8, 8)).shape == (4, 10)
    cnn = models.SmallCNN(in_channels=3, n_classes=5, image_size=16, width=4)
    assert cnn(torch.randn(2, 3, 16, 16)).shape == (2, 5)


def test_gpt_logits_shape_and_context_limit():
    gpt = make_gpt()
    idx = torch.randint(0, 11, (3, 8))
    assert gpt(idx).shape == (3, 8, 11)
    assert gpt(idx[:, :5]).shape == (3, 5, 11)
    with pytest.raises(ValueError, match="block_size"):
        gpt(torch.zeros(1, 9, dtype=torch.long))
    assert gpt.num_params() == sum(p.numel() for p in gpt.parameters())


def test_gpt_is_causal():
    gpt = make_gpt()
    idx = torch.randint(0, 11, (2, 8))
    changed = idx.clone()
    changed[:, 5] = (idx[:, 5] + 1) % 11
    a, b = gpt(idx), gpt(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], msg="positions before 5 must not see token 5")
    assert not torch.allclose(a[:, 5:], b[:, 5:]), "positions from 5 on should see the change"


def reference_attention(attn, x):
    """Causal multi-head attention written out: softmax(q k^T / sqrt(hs) + mask) v."""
    B, T, C = x.shape
    hs = attn.head_size

    def heads(t):
        return t.view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)

    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    y = (weights @ v).transpose(1, 2).reshape(B, T, C)
    return attn.out_proj(y)


def test_sdpa_attention_matches_the_written_out_formula():
    gpt = make_gpt()
    attn = gpt.blocks[0].attn
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(attn(x), reference_attention(attn, x), rtol=1e-5, atol=1e-5)


def test_gpt_parts_run_one_by_one_like_pipeline_stages():
    gpt = make_gpt()
    assert isinstance(gpt.blocks, torch.nn.ModuleList) and len(gpt.blocks) == 2
    assert all(isinstance(b, models.Block) for b in gpt.blocks)
    idx = torch.randint(0, 11, (2, 8))
    stage0 = torch.nn.Sequential(gpt.embed, gpt.blocks[0])  # what pipeline stage 0 would hold
    stage1 = torch.nn.Sequential(gpt.blocks[1], gpt.ln_f, gpt.lm_head)
    torch.testing.assert_close(stage1(stage0(idx)), gpt(idx))


def test_attention_split_by_heads_sums_to_the_whole():
    """Megatron-style: q/k/v split by output columns (heads), out_proj by input columns; the
    partial outputs add up to the full layer. The module reads its head count from the width."""
    gpt = make_gpt()
    full = gpt.blocks[0].attn
    x = torch.randn(2, 8, 32)
    tp_size, C = 2, 32
    cols = C // tp_size
    total = 0
    for rank in range(tp_size):
        part = models.CausalSelfAttention(CONFIG).eval()
        rows = slice(rank * cols, (rank + 1) * cols)
        for name in ("q_proj", "k_proj", "v_proj"):
            src, dst = getattr(full, name), getattr(part, name)
            dst.weight = torch.nn.Parameter(src.weight[rows].clone())  # (C/tp, C)
            dst.bias = torch.nn.Parameter(src.bias[rows].clone())
        part.out_proj.weight = torch.nn.Parameter(full.out_proj.weight[:, rows].clone())
        part.out_proj.bias = torch.nn.Parameter(torch.zeros(C))  # added once, below
        total = total + part(x)  # the all-reduce, by hand
    torch.testing.assert_close(total + full.out_proj.bias, full(x), rtol=1e-5, atol=1e-5)


def test_residual_projections_start_small():
    gpt = make_gpt(models.GPTConfig(n_layer=8))
    block = gpt.blocks[0]
    assert block.attn.out_proj.weight.std() < 0.5 * block.attn.q_proj.weight.std()
    assert block.ff.proj.weight.std() < 0.5 * block.ff.fc.weight.std()


def test_generate_greedy_is_deterministic_and_crops_the_context():
    gpt = make_gpt()
    start = torch.zeros(2, 3, dtype=torch.long)
    out = gpt.generate(start, max_new_tokens=10, temperature=0)  # 13 tokens > block_size 8
    assert out.shape == (2, 13) and torch.equal(out[:, :3], start)
    assert torch.equal(out, gpt.generate(start, 10, temperature=0))
    nxt = gpt(out[:, -8:])[:, -1].argmax(-1)  # greedy: the next token is the argmax
    assert torch.equal(gpt.generate(out, 1, temperature=0)[:, -1], nxt)
    g = torch.Generator().manual_seed(0)
    sampled = gpt.generate(start, 5, temperature=1.0, top_k=3, generator=g)
    assert sampled.shape == (2, 8) and sampled.max() < 11


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    gpt = models.GPT(models.GPTConfig(vocab_size=11, block_size=8, dropout=0.5))
    idx = torch.randint(0, 11, (2, 8))
    gpt.train()
    assert not torch.equal(gpt(idx), gpt(idx))
    gpt.eval()
    assert torch.equal(gpt(idx), gpt(idx))
    assert F.softmax(gpt(idx), -1).sum(-1).allclose(torch.ones(2, 8))
