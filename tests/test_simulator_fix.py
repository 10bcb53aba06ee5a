"""The simulator's shared-memory race (gpulab/simulator_fix.py), forced: np.empty waits until
every thread of the block has called it, so that each finds the array missing."""

import sys
import threading
import types

import numpy as np
import pytest
from numba import cuda, float32

import gpulab
from gpulab import simulator_fix

pytestmark = pytest.mark.skipif(not gpulab.runner.simulator, reason="the simulator's own race")

kernelapi = pytest.importorskip("numba.cuda.simulator.kernelapi")


THREADS_PER_BLOCK = 16


@pytest.fixture
def slow_allocations(monkeypatch):
    """np.empty, as kernelapi sees it, returns only once all the block's threads have called it:
    none has stored its array yet, so each found it missing (the race, every time). The
    timeout only ends a wait that cannot fill: it fails the test, it does not pass it."""
    slow_np = types.ModuleType("numpy")
    slow_np.__dict__.update(np.__dict__)
    every_thread = threading.Barrier(THREADS_PER_BLOCK)

    def slow_empty(*args, **kwargs):
        every_thread.wait(timeout=60)
        return np.empty(*args, **kwargs)

    slow_np.empty = slow_empty
    monkeypatch.setattr(kernelapi, "np", slow_np)
    monkeypatch.setattr(simulator_fix, "np", slow_np)


@cuda.jit
def tile_sums(out, x):
    """out[i] = sum of x over i's block, each thread reading the tile its block loaded."""
    tile = cuda.shared.array(THREADS_PER_BLOCK, float32)
    tile[cuda.threadIdx.x] = x[cuda.grid(1)]
    cuda.syncthreads()
    acc = float32(0.0)
    for j in range(THREADS_PER_BLOCK):
        acc += tile[j]
    out[cuda.grid(1)] = acc


def run_tile_sums():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros_like(x)
    tile_sums[2, THREADS_PER_BLOCK](out, x)
    want = np.repeat(x.reshape(2, THREADS_PER_BLOCK).sum(axis=1), THREADS_PER_BLOCK)
    return np.array_equal(out, want)


def test_the_fix_is_in():
    assert kernelapi.FakeCUDAShared.array is simulator_fix._shared_array


def test_threads_share_one_array_even_when_allocation_is_slow(slow_allocations):
    assert run_tile_sums()


def test_without_the_fix_the_race_shows(slow_allocations, monkeypatch):
    # The test above could not fail if the race were not real: here it is, unfixed.
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", _unfixed_array)
    assert not run_tile_sums()


def _unfixed_array(self, shape, dtype):
    """The simulator's original logic, check then act, with the caller found as it finds it."""
    caller = sys._getframe(1)
    site = (caller.f_code.co_filename, caller.f_lineno)
    array = self._allocations.get(site)
    if array is None:
        array = kernelapi.np.empty(shape, np.float32)
        self._allocations[site] = array
    return array


def test_install_patches_on_import_and_only_once():
    meta_path = []
    simulator_fix.install(modules={}, meta_path=meta_path)
    simulator_fix.install(modules={}, meta_path=meta_path)
    assert len(meta_path) == 1
    assert meta_path[0].find_spec("numba.cuda.something_else", None) is None
