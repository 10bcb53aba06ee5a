"""Lab 4's out-of-memory run, as a value: a tiny GPT, a batch, AdamW and a device that is too small.

    scenario = oom_scenario()                    # the lab's; oom_scenario(batch_size=13, seed=4)
    model, optimizer, x, y = scenario.make()     # fresh and seeded: the same on every runner
    scenario.plain_step(model, optimizer, x, y)  # the first script's step: fp32, all of x at once
    print(scenario.run(scenario.plain_step))     # under the budget: OOM, and what was live
    print(scenario.run(my_step))                 # fits: its peak against the budget

The model is a 4-Block GPT (C = 64, 4 heads, a vocabulary of 64 tokens, 216,448 parameters)
trained with AdamW on B = 16 sequences of T = 128 tokens. Long sequences against a small model:
at the plain step's peak the activations hold 86% of the bytes and the model states (weights,
gradients, AdamW's two moments) 7%, so sharding the model states could not save it; shrinking
the activations does. The token ids and targets are random, drawn from a generator seeded with
`seed` (nothing is downloaded).

The budget is the device's memory: half the plain step's peak at B = 16, estimated on paper
(gpulab.memory.estimate_memory, which matches the CPU's measurement to the byte), rounded down to
a whole MiB: 18 MiB against a peak of 37.3 MiB. It does not change with batch_size: the same
device, other batches. Under it, on the CPU, each run of two steps from a fresh optimizer
(measured; tests/test_checks_lab4.py keeps these relations true):

    plain fp32 step, all 16 at once             out of memory
    bf16 autocast alone                         out of memory (its peak is ~70% of the plain one)
    accumulation over 2 micro-batches of 8      out of memory (~60%)
    accumulation over 3 micro-batches (6+5+5)   fits, peak ~87% of the budget
    accumulation over 4 micro-batches of 4      fits, ~67%
    checkpointing every Block, 16 at once       fits, ~81%
    bf16 autocast + 2 micro-batches             fits, ~83%

run() and the lab's checkers use the CPU on every runner: there the budget is a
gpulab.memory.MemoryTracker that counts exactly the step's tensors, so the same code gives the
same OOM, at the same op, everywhere. make(device="cuda") and run(device="cuda") work too, and
then memory_budget limits the CUDA caching allocator (set_per_process_memory_fraction) and the
error is CUDA's own; but at a budget of a few MiB that is coarse: the allocator reserves 2 MiB
segments, cuBLAS keeps workspaces of several MiB, and the budget covers all of them (lesson 07
adds them to its budget). That path is written to CUDA's documented semantics and is not run by
the course's tests.
Taught in: lessons/07_gpu_memory.ipynb; practised in Lab 4 ("Fix the OOM")
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gpulab.memory.breakdown import format_bytes
from gpulab.memory.budget import memory_budget
from gpulab.memory.estimate import estimate_memory
from gpulab.memory.oom import OOMReport, explain_oom, free_memory
from gpulab.models import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=64, block_size=128, n_layer=4, n_head=4, n_embd=64)
BATCH_SIZE = 16  # the lab's batch; the budget is sized against it
LR = 1e-3
BUDGET_FRACTION = 0.5  # of the plain step's estimated peak at BATCH_SIZE
MiB = 2**20


def budget_for(config: GPTConfig = CONFIG, batch_size: int = BATCH_SIZE,
               fraction: float = BUDGET_FRACTION) -> int:
    """`fraction` of the plain fp32 AdamW step's peak, estimated on paper for the CPU, rounded
    down to a whole MiB."""
    peak = estimate_memory(config, batch_size, seq_len=config.block_size, optimizer="adamw",
                           device_type="cpu").peak_bytes
    return int(fraction * peak) // MiB * MiB


@dataclass(frozen=True)
class BudgetRun:
    """What running a step function under the scenario's budget did."""

    fitted: bool
    budget_bytes: int
    peak_bytes: int  # fitted: the most bytes live at once; OOM: live + the allocation that failed
    losses: tuple[float, ...]  # one per step that ran to the end
    report: OOMReport | None = None  # OOM: what was live, by category, and what to try

    def __str__(self) -> str:
        if self.fitted:
            return (f"fits: peak {format_bytes(self.peak_bytes)} of a "
                    f"{format_bytes(self.budget_bytes)} budget "
                    f"({self.peak_bytes / self.budget_bytes:.0%}), losses "
                    + ", ".join(f"{v:.4f}" for v in self.losses))
        return f"out of memory after {len(self.losses)} step(s)\n{self.report}"


@dataclass(frozen=True)
class OOMScenario:
    """A GPT training step that does not fit in budget_bytes as first written."""

    config: GPTConfig = CONFIG  # the model's shape
    batch_size: int = BATCH_SIZE  # B sequences per optimizer step
    seq_len: int = CONFIG.block_size  # T tokens per sequence
    lr: float = LR  # AdamW's learning rate (other settings: torch's defaults)
    seed: int = 0  # the model's initial weights and the batch's tokens
    budget_bytes: int = field(default_factory=budget_for)  # the device's memory

    def make(self, device=None):
        """(model, optimizer, x, y), fresh: a GPT seeded with `seed`, AdamW, and a batch of token
        ids x and targets y, both (B, T), on `device` (default: the CPU)."""
        device = torch.device(device or "cpu")
        with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
            torch.manual_seed(self.seed)
            model = GPT(self.config)
        model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr)
        g = torch.Generator().manual_seed(self.seed + 1)
        tokens = torch.randint(0, self.config.vocab_size, (self.batch_size, self.seq_len + 1),
                               generator=g)  # (B, T + 1)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # y: the next token
        return model, optimizer, x.to(device), y.to(device)

    @staticmethod
    def plain_step(model, optimizer, x, y):
        """One AdamW step on the whole batch as a first script writes it: fp32, no tricks.
        Returns the mean cross-entropy, detached."""
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)  # (B, T, vocab_size)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        return loss.detach()

    def estimate(self, device_type: str = "cpu", **kwargs):
        """estimate_memory of the plain step (kwargs: precision=, checkpointing=, ...)."""
        return estimate_memory(self.config, self.batch_size, seq_len=self.seq_len,
                               optimizer="adamw", device_type=device_type, **kwargs)

    def run(self, step_fn, steps: int = 2, device=None) -> BudgetRun:
        """step_fn(model, optimizer, x, y) `steps` times on a fresh make(device), all under
        memory_budget(budget_bytes): the first step creates AdamW's state, the next ones run
        with it, as every later step of a training run does."""
        model, optimizer, x, y = self.make(device)
        losses = []
        try:
            with memory_budget(self.budget_bytes, model=model, optimizer=optimizer,
                               tensors=(x, y)) as budget:
                for _ in range(steps):
                    losses.append(float(step_fn(model, optimizer, x, y)))
        except torch.OutOfMemoryError as error:
            report = explain_oom(error)
            error.__traceback__ = None  # the report keeps what it needs; let the step's go
            del error
            free_memory(x.device)
            return BudgetRun(False, self.budget_bytes, report.live.total + report.tried_bytes,
                             tuple(losses), report)
        return BudgetRun(True, self.budget_bytes, budget.peak_bytes, tuple(losses))

    def __str__(self) -> str:
        c = self.config
        with torch.device("meta"):  # shapes only: no memory, no random numbers drawn
            n_params = GPT(c).num_params()
        return (f"GPT: {c.n_layer} Blocks, C = {c.n_embd}, {c.n_head} heads, vocabulary "
                f"{c.vocab_size}, {n_params:,} parameters; AdamW(lr={self.lr:g}); a batch of "
                f"B = {self.batch_size} sequences of T = {self.seq_len} tokens (seed "
                f"{self.seed}); device memory {format_bytes(self.budget_bytes)}")


def oom_scenario(batch_size: int = BATCH_SIZE, seed: int = 0) -> OOMScenario:
    """The lab's scenario; other batch sizes and seeds keep the same model and budget."""
    return OOMScenario(batch_size=batch_size, seed=seed)
