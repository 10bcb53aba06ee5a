"""A thread-safety fix for Numba's CUDA simulator, installed by the cpu runner.

The simulator runs every CUDA thread of a block as a Python thread. Its `cuda.shared.array`
looks the block's array up by call site and creates it when missing: check, then act. Two
threads of the first block can both find it missing and each keep an array of its own, so a
correct tiled kernel sometimes reads tiles its neighbours never wrote (numba 0.68,
numba/cuda/simulator/kernelapi.py, FakeCUDAShared.array). It shows up under load, rarely, as a
right kernel graded wrong. Here the array is stored with dict.setdefault, which is atomic under
the GIL: every thread gets the one array that won.

The fix goes in when numba.cuda's simulator is imported (or at once, if it already was).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

import numpy as np

KERNELAPI = "numba.cuda.simulator.kernelapi"


def _shared_array(self, shape, dtype):
    """FakeCUDAShared.array with the race closed; same keys (file and line) as the original."""
    if shape == 0:  # dynamic shared memory: a view of one buffer, nothing created
        return _original(self, shape, dtype)
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    caller = sys._getframe(1)
    site = (caller.f_code.co_filename, caller.f_lineno)
    array = self._allocations.get(site)
    if array is None:
        array = self._allocations.setdefault(site, np.empty(shape, dtype))
    return array


_original = None


def patch(kernelapi) -> bool:
    """Put the fix into an imported kernelapi module; False if its FakeCUDAShared is not the
    one this fix was written for (a newer Numba may have changed or fixed it)."""
    global _original
    shared = kernelapi.FakeCUDAShared
    if shared.array is _shared_array:
        return True
    if "_allocations" not in shared.__init__.__code__.co_names:
        return False
    _original = shared.array
    shared.array = _shared_array
    return True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds kernelapi like the normal path finder, then patches it right after it runs."""

    def find_spec(self, name, path, target=None):
        if name != KERNELAPI:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module  # this loader object serves this one module only

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install(modules=sys.modules, meta_path=sys.meta_path) -> None:
    """Patch the simulator now if it is loaded, else when it is."""
    if KERNELAPI in modules:
        patch(modules[KERNELAPI])
    elif not any(isinstance(finder, _PatchOnImport) for finder in meta_path):
        meta_path.insert(0, _PatchOnImport())
