"""Datasets that need no download, and DataLoader settings chosen for the runner.

Blobs             seeded Gaussian clusters: a classification task for the MLP
Digits            scikit-learn's bundled 8x8 handwritten digits (1,797 images), for the CNN
ReverseSequences  reverse a random token sequence: a task for the tiny GPT with an exact answer
CharCorpus        next-character prediction on a short text shipped in this module
SeededSampler     a shuffle that depends only on (seed, epoch) and can start mid-epoch, so a
                  resumed run sees the same batches in the same order
loader_settings / make_loader   num_workers, pin_memory, persistent_workers for the runner

Every dataset returns (x, y) pairs of tensors. Targets of -1 are "no loss here" (ignore_index).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb (data loading)
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

IGNORE_INDEX = -1  # targets the loss skips (the prompt half of ReverseSequences)


class Blobs(Dataset):
    """`n_samples` points in `n_features` dimensions around `n_classes` random centres.

    The same seed gives the same points; `spread` (the standard deviation around each centre)
    against the distance between centres sets how hard the task is.
    """

    def __init__(self, n_samples: int = 512, n_classes: int = 3, n_features: int = 2,
                 spread: float = 1.0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        centres = torch.randn(n_classes, n_features, generator=g) * 4.0  # (n_classes, F)
        self.y = torch.arange(n_samples) % n_classes  # balanced classes, (N,)
        noise = torch.randn(n_samples, n_features, generator=g) * spread
        self.x = centres[self.y] + noise  # (N, F)
        self.n_classes, self.n_features = n_classes, n_features

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Digits(Dataset):
    """The 8x8 handwritten digits bundled inside scikit-learn (no download), as float32 images.

    x is (1, 8, 8) in [0, 1] (or (64,) with flat=True), y is the digit 0-9. `split` picks a
    seeded `test_fraction` of the images ("test"), the rest ("train"), or "all".
    """

    def __init__(self, split: str = "train", test_fraction: float = 0.2, seed: int = 0,
                 flat: bool = False):
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        try:  # imported here: scikit-learn is only needed for this one dataset
            from sklearn.datasets import load_digits
        except ImportError as err:
            raise ImportError(
                "Digits needs scikit-learn, which ships the 8x8 digits inside the package (no "
                "download): `pip install scikit-learn` (or `conda install scikit-learn`)."
            ) from err
        bunch = load_digits()
        x = torch.tensor(bunch.images, dtype=torch.float32) / 16.0  # pixel values are 0..16
        y = torch.tensor(bunch.target, dtype=torch.int64)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        n_test = round(len(y) * test_fraction)
        keep = {"test": order[:n_test], "train": order[n_test:], "all": order}[split]
        self.x = x[keep].reshape(-1, 64) if flat else x[keep].unsqueeze(1)  # (N, 64) | (N,1,8,8)
        self.y = y[keep]
        self.n_classes = 10

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class ReverseSequences(Dataset):
    """Given `length` random tokens, produce them reversed: "3 1 4 1" -> "1 4 1 3".

    Item i is next-token prediction on prompt + answer, shifted by one (the GPT convention):
    x = (seq + rev)[:-1] and y = (seq + rev)[1:], both (2*length - 1,). The targets inside the
    prompt are IGNORE_INDEX: random tokens cannot be predicted, only the answer can.
    """

    def __init__(self, n_samples: int = 1024, length: int = 6, vocab_size: int = 10,
                 seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        seq = torch.randint(0, vocab_size, (n_samples, length), generator=g)  # (N, L)
        full = torch.cat([seq, seq.flip(1)], dim=1)  # (N, 2L)
        self.x = full[:, :-1].clone()  # (N, 2L-1)
        self.y = full[:, 1:].clone()  # (N, 2L-1)
        self.y[:, : length - 1] = IGNORE_INDEX
        self.length, self.vocab_size = length, vocab_size
        self.block_size = 2 * length - 1  # the GPT's context must hold a whole example

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


TINY_TEXT = """\
A graphics processor is a machine for doing the same small thing to many numbers at once.
Thousands of threads run in lockstep groups called warps, and warps are gathered into blocks
that share a little fast memory. A kernel is the code every thread runs; the grid says how
many blocks run it. Memory is the usual limit: a thread that waits for data does nothing, so
good kernels read neighbouring addresses together, keep reused values in shared memory, and
do as much arithmetic as they can for every byte they load. Training a network is a long
chain of such kernels: matrix multiplications, additions, softmaxes and their gradients.
Mixed precision halves the bytes and doubles the arithmetic rate; loss scaling keeps small
gradients alive in half precision. When one device is not enough, many devices split the
work: each holds a copy of the model and a slice of the batch, and an all-reduce averages
their gradients after every step, so that all copies stay the same.
"""


class CharCorpus(Dataset):
    """Next-character prediction on `text` (default: TINY_TEXT, shipped in this module).

    Item i is x = text[i : i+block_size] and y = text[i+1 : i+block_size+1] as token ids (T,).
    """

    def __init__(self, block_size: int = 32, text: str = TINY_TEXT):
        if len(text) <= block_size:
            raise ValueError(f"text has {len(text)} characters; block_size {block_size} needs more")
        self.chars = sorted(set(text))
        self.vocab_size = len(self.chars)
        self.block_size = block_size
        self._index = {c: i for i, c in enumerate(self.chars)}
        self.data = self.encode(text)  # (len(text),)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self._index[c] for c in s], dtype=torch.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def __len__(self) -> int:
        return len(self.data) - self.block_size

    def __getitem__(self, i):
        chunk = self.data[i : i + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class SeededSampler(Sampler[int]):
    """Indices 0..n-1, shuffled by a permutation that depends only on (seed, epoch).

    Like DistributedSampler, call set_epoch(epoch) before each epoch (gpulab.train does). Because
    the order is a pure function of (seed, epoch), a resumed run recreates it exactly, and
    start_at(i) skips the first i indices of the next pass without loading them.
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self._start = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def start_at(self, index: int) -> None:
        """The next pass begins at position `index` of this epoch's order (then back to 0)."""
        self._start = index

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + self.epoch)  # no global RNG touched
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        start, self._start = self._start, 0
        return iter(self.order()[start:])

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True)
class LoaderSettings:
    """DataLoader keyword arguments that depend on the machine, not on the dataset."""

    num_workers: int  # processes preparing batches while the device computes
    pin_memory: bool  # page-locked host buffers, for asynchronous copies to a CUDA GPU
    persistent_workers: bool  # keep the worker processes alive from one epoch to the next


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the CPUs this process may use (containers, Colab)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def loader_settings(runner=None) -> LoaderSettings:
    """The settings for `runner` (default: gpulab.runner)."""
    if runner is None:
        import gpulab

        runner = gpulab.runner
    accelerator = runner.device_kind != "cpu"
    # Workers help when the device computes while the host prepares the next batch. On the cpu
    # runner the model needs those same cores, and the course datasets are tensors already in
    # memory, so workers would only add start-up time and inter-process copies. Workers that are
    # spawned (macOS, Windows; forkserver from Python 3.14) must unpickle the dataset, which fails
    # for a dataset class defined in a notebook cell: only fork-started workers are used.
    forks = multiprocessing.get_context().get_start_method() == "fork"  # without fixing it
    # Up to 4 (more rarely helps in-memory data), leaving one core to the training process.
    num_workers = min(4, _usable_cpus() - 1) if accelerator and forks else 0
    return LoaderSettings(
        num_workers=num_workers,
        # Pinned (page-locked) memory lets a CUDA copy run by DMA, overlapped with compute when
        # made with .to(device, non_blocking=True). Nothing to copy on the CPU; MPS ignores it.
        pin_memory=runner.device_kind == "cuda",
        # Re-creating workers costs a process start per worker per epoch; DataLoader refuses
        # persistent_workers without workers, hence tied to num_workers.
        persistent_workers=num_workers > 0,
    )


def make_loader(dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False, runner=None, **overrides) -> DataLoader:
    """A DataLoader with a SeededSampler and loader_settings(runner); `overrides` win."""
    settings = {**loader_settings(runner).__dict__, **overrides}
    if settings["num_workers"] == 0:
        settings["persistent_workers"] = False
    return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last,
                      sampler=SeededSampler(len(dataset), seed=seed, shuffle=shuffle), **settings)
