"""The capstone's reference: the same model, data and optimizer in one process, no parallelism.

    reference_losses(config, steps=6, precision="bf16")     # [5.61, 5.20, ...] one per step

Each step sees the whole global batch (data.token_batch), so the mean loss is what the
distributed run's all-reduced loss estimates. precision "bf16"/"fp16" runs the forward under
torch.autocast in that dtype, the closest single-process relative of FSDP2's mixed precision
(which casts the gathered weights themselves): the two differ by rounding, and the checker's
tolerance allows for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpulab.capstone.data import token_batch
from gpulab.models import GPT


def reference_losses(config, steps: int | None = None, precision: str = "fp32") -> list[float]:
    """The loss of each of the first `steps` steps (default config.steps) of training config's
    GPT in one process, on one thread, on the CPU."""
    steps = config.steps if steps is None else steps
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks do
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = GPT(config.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
        losses = []
        for step in range(steps):
            x, y = token_batch(config, step)  # (B, T) each
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses
