"""A training loop written the way a first script is: correct, and slow for reasons a profile shows.

    problem = pipeline_problem(seed=0)
    losses, model = problem.run(slow_train)      # fresh seeded model and optimizer, then train
    show_source(slow_train)                      # read the loop you are asked to speed up

slow_train trains an MLP on the raw 8x8 digits (uint8 pixels 0..16). Lab 4 shows its source and
asks the learner to find, by profiling and counting, what it pays for every step; its comments
say what each line does, not what it costs, and the lab's hints live beside its checkers. What
a profile finds:

    a transform in Python   each example is standardized pixel by pixel in __getitem__, and
                            built into a tensor row by row, every time it is read
    micro-batches           the batch of 64 goes through the model 8 examples at a time
    host syncs              loss.item(), an isfinite(...).item() check and a .cpu() copy for
                            logging, per micro-batch
    many small copies       each micro-batch is copied to the device on its own, blocking

Everything it computes is fixed by its arguments (its docstring says exactly what), so a fast
version can reproduce its losses and weights to float rounding; Lab 4 asks for one, `fast_train`.
Its steps are labelled with gpulab.profiling.phase, so profile_steps splits them into phases.

Measured on the CPU runner only (one thread): a few milliseconds a step, most of it in the
transform, the rest in the micro-batches' forward and backward passes; the syncs cost little,
because on a CPU there is nothing to wait for. What a GPU would show follows from CUDA's
documented behaviour and was not run here: each .item() or .cpu() makes the host wait until the
device has finished all the work queued so far, so the host can never run ahead; each micro-batch
launches its own handful of tiny kernels (launch overhead, and an idle device in between) and its
own small copy from pageable memory; and the device idles while the host transforms pixels.
Taught in: Lab 4 (solutions/lab4_memory_and_profiling), lessons/08_profiling_and_optimization
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from gpulab.models import MLP
from gpulab.profiling.steps import phase

MICRO_BATCH_SIZE = 8  # examples per forward pass in slow_train (what once fit in memory)
STEPS, BATCH_SIZE = 300, 64  # the problem's defaults: about 11 passes over the 1,797 digits
HIDDEN = 128  # MLP width: 64 pixels -> 128 -> 10 classes (one hidden layer)
LR, MOMENTUM = 0.05, 0.9  # SGD

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def raw_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as stored: images (N, 8, 8) uint8 with pixels 0..16, labels (N,) int64.
    Loaded once per process (scikit-learn's import takes about a second); treat as read-only."""
    from gpulab.data import Digits

    digits = Digits("all", seed=0)  # a fixed order; slow_train's seed shuffles it
    images = (digits.x.squeeze(1) * 16).round().to(torch.uint8)  # Digits scaled them by 1/16
    return images, digits.y


class TransformedDigits(Dataset):
    """Item i: image i as 64 standardized floats (64,), and its label. The transform runs in
    Python, one pixel at a time, every time an item is read: v = pixel / 16, then (v - mean) / std
    with the mean and the standard deviation (divided by 64, not 63) of that image's 64 values."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels  # (N, 8, 8) uint8, (N,) int64

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        rows = self.images[i].tolist()  # 8 lists of 8 Python ints, 0..16
        values = []
        for row in rows:
            for pixel in row:
                values.append(pixel / 16)
        mean = sum(values) / len(values)
        squares = 0.0
        for v in values:
            squares += (v - mean) ** 2
        std = math.sqrt(squares / len(values))  # no digit is blank: std > 0
        x = torch.empty(8, 8)  # float32
        for r, row in enumerate(rows):
            x[r] = torch.tensor([(pixel / 16 - mean) / std for pixel in row])  # row by row
        return x.flatten(), self.labels[i]  # (64,), ()


def example_order(n: int, steps: int, batch_size: int, seed: int) -> list[int]:
    """The indices slow_train reads, in order: permutations of range(n) drawn one after another
    from torch.Generator().manual_seed(seed) with torch.randperm(n, generator=g), one per pass
    over the data, concatenated and cut to the first steps * batch_size."""
    g = torch.Generator().manual_seed(seed)
    passes = math.ceil(steps * batch_size / n)
    order = torch.cat([torch.randperm(n, generator=g) for _ in range(passes)])
    return order[: steps * batch_size].tolist()


def slow_train(model, optimizer, images, labels, *, steps: int, batch_size: int,
               seed: int) -> list[float]:
    """Train `model` for `steps` optimizer steps; return each step's loss as a Python float.

    model      an MLP taking (B, 64) float32 pixels; the work runs on its parameters' device
    optimizer  over model's parameters; called once per step (zero_grad, then step)
    images     (N, 8, 8) uint8 pixels 0..16, on the CPU; labels (N,) int64 digits 0..9
    Step s:
      - its examples: positions s*batch_size .. (s+1)*batch_size - 1 of example_order(N, steps,
        batch_size, seed); the batch may straddle two passes over the data;
      - each example's input: its 8x8 pixels flattened row by row to 64 values v = pixel / 16,
        then standardized per image, (v - mean) / std, with that image's mean and standard
        deviation over its 64 values (dividing by 64: torch's correction=0), as float32;
      - the loss: the mean cross-entropy over the batch's batch_size examples, computed here as
        MICRO_BATCH_SIZE examples at a time, each micro-batch's mean weighted by its share of
        the batch, with the gradients adding up in .grad; then one optimizer.step();
      - the value returned for step s: that mean loss, before the step's update.
    batch_size must be a multiple of MICRO_BATCH_SIZE. No randomness other than `seed`."""
    if batch_size % MICRO_BATCH_SIZE:
        raise ValueError(f"batch_size must be a multiple of {MICRO_BATCH_SIZE}, got {batch_size}")
    device = next(model.parameters()).device
    order = example_order(len(labels), steps, batch_size, seed)
    loader = DataLoader(TransformedDigits(images, labels), batch_size=MICRO_BATCH_SIZE,
                        sampler=order, num_workers=0)  # a list of indices is a valid sampler
    micro_batches = iter(loader)
    model.train()
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        step_loss, correct = 0.0, 0
        for _ in range(batch_size // MICRO_BATCH_SIZE):
            with phase("data"):
                x, y = next(micro_batches)  # MICRO_BATCH_SIZE examples, each transformed above
                x, y = x.to(device), y.to(device)  # this micro-batch, to the model's device
            with phase("forward"):
                logits = model(x)  # (MICRO_BATCH_SIZE, 10)
                loss = F.cross_entropy(logits, y) * (len(y) / batch_size)  # its share
            with phase("backward"):
                loss.backward()  # adds into .grad
            step_loss += loss.item()  # its share of the step's loss, as a Python float
            if not torch.isfinite(loss).item():  # stop at the first NaN or infinite loss
                raise FloatingPointError(f"the loss is {loss.item()} at step {step}")
            correct += int((logits.argmax(1).cpu() == y.cpu()).sum())  # right answers, logged
        with phase("optimizer"):
            optimizer.step()
        log.debug("step %d: loss %.4f, accuracy %.3f", step, step_loss, correct / batch_size)
        losses.append(step_loss)
    return losses


@dataclass(frozen=True)
class PipelineProblem:
    """What slow_train (and a fast version of it) is run on; `run` makes a fresh start."""

    images: torch.Tensor  # (N, 8, 8) uint8, pixels 0..16, on the CPU
    labels: torch.Tensor  # (N,) int64
    steps: int  # optimizer steps
    batch_size: int  # examples per step
    seed: int  # sets both the initial weights and the order of the examples
    device: torch.device  # where new_model puts the model

    def new_model(self) -> MLP:
        """The MLP(64, 10, hidden=HIDDEN, n_hidden=1) that `seed` gives, on `device` (the
        global random state is left alone)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = MLP(64, 10, hidden=HIDDEN, n_hidden=1)
        return model.to(self.device)

    def new_optimizer(self, model) -> torch.optim.Optimizer:
        """SGD with lr=LR and momentum=MOMENTUM over the model's parameters."""
        return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def run(self, train) -> tuple[list, MLP]:
        """train(model, optimizer, images, labels, steps=, batch_size=, seed=) on a new model and
        optimizer and copies of the data: (what train returned, the trained model)."""
        model = self.new_model()
        optimizer = self.new_optimizer(model)
        losses = train(model, optimizer, self.images.clone(), self.labels.clone(),
                       steps=self.steps, batch_size=self.batch_size, seed=self.seed)
        return losses, model


def pipeline_problem(seed: int = 0, steps: int = STEPS, batch_size: int = BATCH_SIZE,
                     device=None) -> PipelineProblem:
    """The digits, and the run's settings; device defaults to gpulab.runner.device."""
    if device is None:
        import gpulab

        device = gpulab.runner.device
    images, labels = raw_digits()
    return PipelineProblem(images, labels, steps, batch_size, seed, torch.device(device))
