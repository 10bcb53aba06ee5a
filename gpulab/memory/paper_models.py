"""The course's models on paper: their forward passes op by op, as a PaperStep sees them.

What each layer keeps for backward (the activation memory) is what autograd saves, and these
are the rules the estimate uses; each was read off MemoryTracker on a real step:

    Linear (addmm)   saves its input (to compute the weight's gradient) and its weight (for the
                     input's); the input is only saved if the weight needs a gradient, the
                     weight only if the input does (so the first layer keeps no weight copy)
    Conv2d           saves its input and weight
    ReLU             saves its output (the mask of positive values is read off it)
    GELU             saves its input
    Dropout          p > 0: saves a mask: 1 byte per element on CUDA (fused kernel), a scaled
                     noise tensor in the input's dtype on the CPU; p = 0 is skipped entirely
    max_pool2d       saves its input and the argmax indices (int64: 8 bytes per output element)
    LayerNorm        saves its input, and the mean and 1/std of each row
    attention (SDPA) flash attention saves q, k, v, the output and a log-sum-exp per row (fp32)
                     instead of the T x T matrix of attention weights: O(T) memory, not O(T^2)
    embedding        saves the token ids (the batch, already counted)
    residual add     saves nothing; its backward hands the same gradient to both branches
    cross-entropy    log_softmax saves its output (B*T x vocab, fp32): often the largest single
                     activation of a small language model

In backward, each op makes a gradient the size of each input that needs one (the add hands its
incoming gradient on as it is), while its incoming gradient and all saved tensors are still live.
With autocast, matmuls and convolutions take bf16/fp16 copies of their inputs and weights. The
copy of a weight is cached for the whole forward pass; an activation is copied at each use, so
q, k and v each make their own copy of the LayerNorm output. LayerNorm and the loss stay fp32.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

from gpulab.memory.timeline import ALIAS, PaperStep


class PaperForward:
    """Layers written on a PaperStep, each the ops torch runs for it, in the same order."""

    def __init__(self, step: PaperStep, recipe):
        self.s, self.r = step, recipe

    def operand(self, t, itemsize=None):
        """A matmul operand: autocast's low-precision copy, or t itself (held either way)."""
        if t is None:
            return None
        if self.r.autocast:
            return self.s.cast(t, itemsize or self.r.compute_itemsize)
        self.s.hold(t)
        return t

    def linear(self, x, w, b, out_numel):
        b_, w_, x_ = self.operand(b), self.operand(w), self.operand(x)  # autocast's order
        saves = ([x_] if w_.requires_grad else []) + ([w_] if x_.requires_grad else [])
        (y,) = self.s.op("linear", [x_, w_, b_], [(out_numel, x_.itemsize)], saves=saves,
                         grads=[x_, w_, b_])
        self.s.release(x_, w_, b_)
        return y

    def conv2d(self, x, w, b, out_numel):
        b_, w_, x_ = self.operand(b), self.operand(w), self.operand(x)
        (y,) = self.s.op("conv2d", [x_, w_, b_], [(out_numel, x_.itemsize)], saves=[x_, w_],
                         grads=[x_, w_, b_])
        self.s.release(x_, w_, b_)
        return y

    def relu(self, x):
        return self.s.op("relu", [x], [(x.numel, x.itemsize)], saves=[0], grads=[x])[0]

    def gelu(self, x):
        return self.s.op("gelu", [x], [(x.numel, x.itemsize)], saves=[x], grads=[x])[0]

    def dropout(self, x, p):
        if p == 0:  # F.dropout(p=0) returns its input: no op, no mask
            self.s.hold(x)
            return x
        if self.s.device_type == "cuda":  # fused native_dropout: output and a 1-byte mask
            y, mask = self.s.op("dropout", [x], [(x.numel, x.itemsize), (x.numel, 1)],
                                saves=[1], grads=[x])
        else:  # the CPU draws a scaled noise tensor in x's dtype, then y = x * noise
            (mask,) = self.s.op("bernoulli", [x], [(x.numel, x.itemsize)],
                                differentiable=False)
            (y,) = self.s.op("mul", [x, mask], [(x.numel, x.itemsize)], saves=[mask],
                             grads=[x])
        self.s.release(mask)
        return y

    def max_pool2d(self, x):
        y, indices = self.s.op("max_pool2d", [x], [(x.numel // 4, x.itemsize),
                                                   (x.numel // 4, 8)], saves=[x, 1], grads=[x])
        self.s.release(indices)
        return y

    def layer_norm(self, x, w, b, rows):
        # mean and 1/std: fp32 on CUDA; on the CPU in the weights' dtype (bf16 for a bf16 model)
        stat = 4 if self.s.device_type == "cuda" else max(x.itemsize, w.itemsize)
        y, mean, rstd = self.s.op("layer_norm", [x, w, b], [(x.numel, x.itemsize), (rows, stat),
                                                            (rows, stat)],
                                  saves=[x, 1, 2], grads=[x, w, b])
        self.s.release(mean, rstd)
        return y

    def embedding(self, ids, w, out_numel):
        return self.s.op("embedding", [ids, w], [(out_numel, w.itemsize)], saves=[ids],
                         grads=[w])[0]

    def add(self, a, b):
        """a + b, broadcasting b; the result takes the wider dtype. The gradient of an input of
        the result's size and dtype is the incoming one itself; others get a reduced or cast
        copy."""
        numel, itemsize = max(a.numel, b.numel), max(a.itemsize, b.itemsize)
        grads = {t: ALIAS if (t.numel, t.itemsize) == (numel, itemsize) else None
                 for t in (a, b)}
        return self.s.op("add", [a, b], [(numel, itemsize)], grads=grads)[0]

    def attention(self, q, k, v, rows_times_heads):
        out, lse = self.s.op("attention", [q, k, v], [(q.numel, q.itemsize),
                                                       (rows_times_heads, 4)],
                             saves=[q, k, v, 0, 1], grads=[q, k, v])
        self.s.release(lse)
        return out

    def cross_entropy(self, logits, targets, n_rows, n_classes):
        z = self.operand(logits, 4)  # autocast runs log_softmax in fp32
        (logp,) = self.s.op("log_softmax", [z], [(n_rows * n_classes, z.itemsize)], saves=[0],
                            grads=[z])
        self.s.release(z)
        loss, total_weight = self.s.op("nll_loss", [logp, targets],
                                       [(1, logp.itemsize), (1, logp.itemsize)],
                                       saves=[targets, 1], grads=[logp])
        self.s.release(total_weight, logp)
        return loss


# ---------------------------------------------------------------- the three models


def mlp_forward(f: PaperForward, batch_size: int, layers: list) -> tuple:
    """MLP.net: layers = [("linear", in, out) | ("relu",) | ("dropout", p)], in order.
    Returns (loss, logits) after creating parameters and batch on f.s."""
    s, r = f.s, f.r
    weights = {}
    for i, layer in enumerate(layers):
        if layer[0] == "linear":
            _, n_in, n_out = layer
            weights[i] = (s.parameter(n_out * n_in, r.param_itemsize, f"net.{i}.weight"),
                          s.parameter(n_out, r.param_itemsize, f"net.{i}.bias"))
    first_in = layers[0][1]
    x = s.batch(batch_size * first_in, r.param_itemsize, "x")  # autocast: fp32 features
    y = s.batch(batch_size, 8, "y")
    h = x
    s.hold(h)
    for i, layer in enumerate(layers):
        if layer[0] == "linear":
            out = f.linear(h, *weights[i], batch_size * layer[2])
        elif layer[0] == "relu":
            out = f.relu(h)
        else:
            out = f.dropout(h, layer[1])
        s.release(h)  # nn.Sequential: `input = module(input)` drops the previous one
        h = out
    return f.cross_entropy(h, y, batch_size, layers[-1][2]), h


def cnn_forward(f: PaperForward, batch_size: int, in_channels: int, width: int,
                image_size: int, n_classes: int, dropout: float) -> tuple:
    """SmallCNN: conv-relu, conv-relu-maxpool, flatten, dropout, linear."""
    s, r = f.s, f.r
    B, HW, p = batch_size, image_size * image_size, r.param_itemsize
    w1 = s.parameter(width * in_channels * 9, p, "conv1.weight")
    b1 = s.parameter(width, p, "conv1.bias")
    w2 = s.parameter(2 * width * width * 9, p, "conv2.weight")
    b2 = s.parameter(2 * width, p, "conv2.bias")
    features = 2 * width * HW // 4
    w3 = s.parameter(n_classes * features, p, "head.weight")
    b3 = s.parameter(n_classes, p, "head.bias")
    x = s.batch(B * in_channels * HW, p, "x")
    y = s.batch(B, 8, "y")
    c1 = f.conv2d(x, w1, b1, B * width * HW)
    a1 = f.relu(c1)
    s.release(c1)
    c2 = f.conv2d(a1, w2, b2, B * 2 * width * HW)
    a2 = f.relu(c2)
    s.release(c2)
    pooled = f.max_pool2d(a2)
    s.release(a2, a1)
    dropped = f.dropout(pooled, dropout)  # x.flatten(1) is a view
    logits = f.linear(dropped, w3, b3, B * n_classes)
    s.release(dropped, pooled)
    return f.cross_entropy(logits, y, B, n_classes), logits


def gpt_forward(f: PaperForward, batch_size: int, seq_len: int, config,
                checkpointing: bool = False, gathered_block_bytes: int = 0) -> tuple:
    """GPT: embeddings, Blocks (optionally each under torch.utils.checkpoint), ln_f, lm_head."""
    s, r = f.s, f.r
    B, T, C, V = batch_size, seq_len, config.n_embd, config.vocab_size
    nh, p = config.n_head, r.param_itemsize
    wte = s.parameter(V * C, p, "wte")
    wpe = s.parameter(config.block_size * C, p, "wpe")
    names = ("ln_1.weight", "ln_1.bias", "q.weight", "q.bias", "k.weight", "k.bias",
             "v.weight", "v.bias", "out.weight", "out.bias", "ln_2.weight", "ln_2.bias",
             "fc.weight", "fc.bias", "proj.weight", "proj.bias")
    sizes = (C, C, C * C, C, C * C, C, C * C, C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C)
    blocks = [{n: s.parameter(k, p, f"blocks.{i}.{n}") for n, k in zip(names, sizes, strict=True)}
              for i in range(config.n_layer)]
    ln_f = (s.parameter(C, p, "ln_f.weight"), s.parameter(C, p, "ln_f.bias"))
    lm_head = s.parameter(V * C, p, "lm_head.weight")
    idx, targets = s.batch(B * T, 8, "idx"), s.batch(B * T, 8, "targets")
    gathered = None
    if gathered_block_bytes:  # ZeRO-3: one Block's parameters gathered at a time
        gathered = s.workspace(gathered_block_bytes, "gathered parameters")

    (pos,) = s.op("arange", [], [(T, 8)])
    tok, pos_emb = f.embedding(idx, wte, B * T * C), f.embedding(pos, wpe, T * C)
    x = f.add(tok, pos_emb)  # dropout(p=0) is skipped
    s.release(tok, pos_emb, pos)
    for w in blocks:
        if checkpointing:
            s.begin_checkpoint(x)
        x_next = _block(f, x, w, B * T, B * T * nh)
        if checkpointing:
            s.end_checkpoint()
        s.release(x)  # GPT.forward: `x = block(x)`
        x = x_next
    h = f.layer_norm(x, *ln_f, B * T)
    logits = f.linear(h, lm_head, None, B * T * V)
    s.release(h, x)
    loss = f.cross_entropy(logits, targets, B * T, V)
    return loss, logits, gathered


def _block(f: PaperForward, x, w, rows, rows_times_heads):
    """Block.forward: x + attn(ln_1(x)), then + ff(ln_2(x)); views and transposes are free."""
    s, BTC = f.s, x.numel
    h = f.layer_norm(x, w["ln_1.weight"], w["ln_1.bias"], rows)
    q, k, v = (f.linear(h, w[f"{n}.weight"], w[f"{n}.bias"], BTC) for n in "qkv")
    y = f.attention(q, k, v, rows_times_heads)
    s.release(q, k, v)
    a = f.linear(y, w["out.weight"], w["out.bias"], BTC)
    s.release(y, h)  # attn returns: its argument ln_1(x) is dropped
    x1 = f.add(x, a)
    s.release(a)
    h2 = f.layer_norm(x1, w["ln_2.weight"], w["ln_2.bias"], rows)
    hidden = f.linear(h2, w["fc.weight"], w["fc.bias"], 4 * BTC)
    g = f.gelu(hidden)
    s.release(hidden)
    out = f.linear(g, w["proj.weight"], w["proj.bias"], BTC)
    s.release(g, h2)
    x2 = f.add(x1, out)
    s.release(out, x1)
    return x2
