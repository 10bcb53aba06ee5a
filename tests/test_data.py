"""gpulab.data: datasets are deterministic and shaped as documented, the sampler's order depends
only on (seed, epoch), and the loader settings follow the runner."""

import multiprocessing
import sys

import pytest
import torch

from gpulab import data
from gpulab.env import Runner

CPU_RUNNER = Runner(name="cpu", requested="cpu", gpu_count=0, in_colab=False)
GPU_RUNNER = Runner(name="gpu", requested="gpu", gpu_count=1, in_colab=False)


def test_blobs_are_seeded_balanced_and_shaped():
    a, b, c = data.Blobs(60, n_classes=3, seed=1), data.Blobs(60, n_classes=3, seed=1), \
        data.Blobs(60, n_classes=3, seed=2)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, c.x)
    x, y = a[0]
    assert x.shape == (2,) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.bincount(a.y).tolist() == [20, 20, 20]


def test_blobs_classes_sit_around_their_centres():
    blobs = data.Blobs(300, n_classes=3, spread=0.1, seed=0)
    centres = torch.stack([blobs.x[blobs.y == k].mean(0) for k in range(3)])  # (3, 2)
    nearest = torch.cdist(blobs.x, centres).argmin(1)
    assert (nearest == blobs.y).float().mean() > 0.95


def test_reverse_sequences_targets_are_the_reversed_prompt():
    ds = data.ReverseSequences(n_samples=20, length=5, vocab_size=7, seed=3)
    assert len(ds) == 20 and ds.block_size == 9
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.shape == y.shape == (9,)
        full = torch.cat([x[:5], x[:5].flip(0)])  # prompt + answer, (10,)
        assert torch.equal(x, full[:-1]), "x is prompt + answer without the last token"
        assert torch.equal(y[4:], full[5:]), "targets are the answer, one position ahead"
        assert (y[:4] == data.IGNORE_INDEX).all(), "random prompt tokens are not predictable"
    assert torch.equal(ds.x, data.ReverseSequences(20, 5, 7, seed=3).x)


def test_char_corpus_round_trip_and_shift():
    ds = data.CharCorpus(block_size=16)
    assert ds.decode(ds.encode(data.TINY_TEXT)) == data.TINY_TEXT
    assert len(ds) == len(data.TINY_TEXT) - 16 and ds.vocab_size == len(set(data.TINY_TEXT))
    x, y = ds[5]
    assert ds.decode(x) == data.TINY_TEXT[5:21] and ds.decode(y) == data.TINY_TEXT[6:22]
    with pytest.raises(ValueError, match="block_size"):
        data.CharCorpus(block_size=10, text="too short")


def test_seeded_sampler_order_depends_only_on_seed_and_epoch():
    s = data.SeededSampler(50, seed=4)
    first = list(s)
    assert sorted(first) == list(range(50)) and first != list(range(50))
    assert list(data.SeededSampler(50, seed=4)) == first
    s.set_epoch(1)
    second = list(s)
    assert second != first and sorted(second) == list(range(50))
    s.start_at(45)
    assert list(s) == second[45:]
    assert list(s) == second, "start_at applies to one pass only"
    assert list(data.SeededSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_make_loader_covers_the_dataset_once_per_epoch():
    ds = data.Blobs(30)
    loader = data.make_loader(ds, batch_size=8, seed=1, runner=CPU_RUNNER)
    assert loader.num_workers == 0 and not loader.pin_memory
    seen = torch.cat([x for x, _ in loader])
    assert seen.shape == (30, 2)
    assert sorted(seen[:, 0].tolist()) == sorted(ds.x[:, 0].tolist())
    assert len(data.make_loader(ds, 8, drop_last=True, runner=CPU_RUNNER)) == 3


def test_loader_settings_on_the_cpu_runner():
    settings = data.loader_settings(CPU_RUNNER)
    assert settings == data.LoaderSettings(num_workers=0, pin_memory=False,
                                           persistent_workers=False)


def test_loader_settings_on_a_gpu_runner(monkeypatch):
    monkeypatch.setattr(data, "_usable_cpus", lambda: 8)
    fork = multiprocessing.get_context("fork")
    monkeypatch.setattr(data.multiprocessing, "get_context", lambda: fork)
    settings = data.loader_settings(GPU_RUNNER)
    assert settings.pin_memory, "pinned memory makes host-to-GPU copies asynchronous"
    assert settings.num_workers == 4 and settings.persistent_workers
    monkeypatch.setattr(data, "_usable_cpus", lambda: 1)  # Colab-like: nothing to spare
    assert data.loader_settings(GPU_RUNNER).num_workers == 0
    assert not data.loader_settings(GPU_RUNNER).persistent_workers


def test_no_workers_where_they_would_be_spawned(monkeypatch):
    monkeypatch.setattr(data, "_usable_cpus", lambda: 8)
    spawn = multiprocessing.get_context("spawn")
    monkeypatch.setattr(data.multiprocessing, "get_context", lambda: spawn)
    assert data.loader_settings(GPU_RUNNER).num_workers == 0


def test_make_loader_overrides_win():
    loader = data.make_loader(data.Blobs(8), 4, runner=CPU_RUNNER, pin_memory=True)
    assert loader.pin_memory


def test_digits_without_scikit_learn_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn...` fail
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match="scikit-learn"):
        data.Digits()


def test_digits_splits_and_shapes():
    pytest.importorskip("sklearn")
    train, test = data.Digits("train"), data.Digits("test")
    assert len(train) + len(test) == len(data.Digits("all")) == 1797
    x, y = train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and 0 <= y < 10
    assert 0.0 <= train.x.min() and train.x.max() <= 1.0
    assert data.Digits("test", flat=True).x.shape == (len(test), 64)
    train_rows = {tuple(r) for r in train.x.flatten(1).tolist()}
    overlap = sum(tuple(r) in train_rows for r in test.x.flatten(1).tolist())
    assert overlap < 5  # only images that happen to be pixel-identical may appear in both
    with pytest.raises(ValueError, match="split"):
        data.Digits("validation")
