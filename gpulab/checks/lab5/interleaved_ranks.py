"""What Lab 5's Part 7 checker runs on each rank: the learner's interleaved order, executed.

    interleaved_rank(rank, world_size, data, log_dir)

Rank s is device s of a pipeline of p = world_size devices, holding two chunks of a small GPT
cut into 2p virtual stages (split_gpt): chunk c is virtual stage c * p + s. It runs its own list
of the learner's order, action by action: a forward receives its input from the device of the
previous virtual stage (or reads the token ids, on virtual stage 0) and sends its output on;
a backward receives its output's gradient from the next virtual stage's device (or starts from
the loss, divided by m, on the last one) and sends its input's gradient back. Sends do not wait
(isend), receives do: an order that passes the simulator's rules cannot deadlock here. Each
message's tag names its action, so messages between the same two devices never mix. Returns
every parameter's gradient by the whole GPT's names, and the loss.

Shipped by value, like ranks.py: nothing here may import gpulab.checks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

N_CHUNKS = 2


def _tag(kind: str, microbatch: int, virtual: int, n_virtual: int) -> int:
    """A distinct tag per (direction, microbatch, sending virtual stage)."""
    return ((kind == "B") * 1000 + microbatch) * n_virtual + virtual


def interleaved_rank(rank, world_size, data, log_dir):
    from gpulab.distributed.pipeline_split import split_gpt
    from gpulab.models import GPT, GPTConfig

    p, m = world_size, data["m"]
    last = p * N_CHUNKS - 1
    gpt = GPT(GPTConfig(**data["config"]))
    gpt.load_state_dict(data["state"])
    stages = split_gpt(gpt, p * N_CHUNKS)
    chunks = {c: stages[c * p + rank] for c in range(N_CHUNKS)}
    xs, ys = data["x"].chunk(m), data["y"].chunk(m)
    shape = (xs[0].shape[0], xs[0].shape[1], data["config"]["n_embd"])  # (B / m, T, C)
    held, sends, loss = {}, [], 0.0
    for kind, i, c in data["order"][rank]:
        k = c * p + rank  # this action's virtual stage
        if kind == "F":
            if k == 0:
                x = xs[i]
            else:
                x = torch.empty(shape)
                dist.recv(x, src=(k - 1) % p, tag=_tag("F", i, k - 1, last + 1))
                x.requires_grad_()
            out = chunks[c](x)
            if k == last:
                out = F.cross_entropy(out.flatten(0, 1), ys[i].flatten()) / m
                loss += out.item()
            else:
                sends.append(dist.isend(out.detach().contiguous(), dst=(k + 1) % p,
                                        tag=_tag("F", i, k, last + 1)))
            held[(i, c)] = (x, out)
            continue
        x, out = held.pop((i, c))
        if k == last:
            out.backward()
        else:
            grad = torch.empty(shape)
            dist.recv(grad, src=(k + 1) % p, tag=_tag("B", i, k + 1, last + 1))
            out.backward(grad)
        if k > 0:
            sends.append(dist.isend(x.grad.contiguous(), dst=(k - 1) % p,
                                    tag=_tag("B", i, k, last + 1)))
    for work in sends:
        work.wait()
    grads = {name: q.grad.clone() for chunk in chunks.values()
             for name, q in chunk.named_parameters() if q.grad is not None}
    return {"grads": grads, "loss": loss}
