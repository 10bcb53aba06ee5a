"""The `cuda` a traced kernel sees: Numba's simulated CUDA module with recording shared memory,
recording atomics and barriers that the scheduler (scheduler.py) keeps the books of.

It is built on the simulator's own `FakeCUDAModule` (numba/cuda/simulator/kernelapi.py), which
supplies threadIdx, grid(), vector types, local arrays and the rest. Those modules import fine
where numba.cuda is the real driver too, so a kernel can be traced from its Python function
(`kernel.py_func`) on a GPU machine as well as on the cpu runner.
"""

from __future__ import annotations

import linecache
import re
import sys
from contextlib import contextmanager

import numpy as np

from gpulab.sim.memory import TracedArray

try:
    from numba.cuda.simulator.kernelapi import Dim3, FakeCUDAAtomic, FakeCUDAModule
except ImportError as exc:  # a Numba without the simulator: say so when someone traces
    Dim3 = FakeCUDAAtomic = FakeCUDAModule = object
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None

# `a_tile = cuda.shared.array(...)`: the name a lesson's reader knows the array by
_SHARED_NAME = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=\s*[\w.]*shared\.array\(")


def require_simulator() -> None:
    if _IMPORT_ERROR is not None:
        raise ImportError("gpulab.sim needs Numba's CUDA simulator (numba.cuda.simulator), "
                          f"which this Numba does not provide: {_IMPORT_ERROR}")


class TracedShared:
    """cuda.shared: each block gets fresh arrays, one per `cuda.shared.array` call site.

    The simulator keys allocations by source line (two on one line alias) and keeps them
    across blocks; here the key is the call itself (code object and bytecode offset) and every
    block starts with its own memory, as on a GPU. Fresh float arrays hold NaN, so a thread
    that reads shared memory nobody wrote sees NaN instead of last block's leftovers."""

    def __init__(self, launch, shared_bytes: int):
        self._launch = launch
        self._shared_bytes = shared_bytes
        self._sites: dict[tuple, int] = {}  # call site -> array id, for the whole launch
        self._block_arrays: dict[tuple, TracedArray] = {}
        self._dynamic = None

    def new_block(self) -> None:
        self._block_arrays = {}
        self._dynamic = np.zeros(self._shared_bytes, dtype=np.uint8)

    def array(self, shape, dtype):
        frame = sys._getframe(1)
        site = (frame.f_code, frame.f_lasti)
        arr = self._block_arrays.get(site)
        if arr is not None:  # a loop or a second call from the same line in this block
            return arr
        dtype = _numpy_dtype(dtype)
        if shape == 0:  # dynamic shared memory: every such array views the launch's bytes
            data = np.frombuffer(self._dynamic.data, dtype=dtype,
                                 count=self._shared_bytes // dtype.itemsize)
        else:
            data = np.empty(shape, dtype)
            data.fill(np.nan if dtype.kind in "fc" else 0)
        aid = self._sites.get(site)
        if aid is None:
            name = self._name(frame)
            aid = self._sites[site] = self._launch.recorder.add_array(
                name, "shared", data.shape, data.dtype)
        arr = self._block_arrays[site] = TracedArray(data, self._launch.recorder, aid)
        return arr

    def _name(self, frame) -> str:
        """The variable the source line assigns, else "shared#k"."""
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        match = _SHARED_NAME.match(text)
        taken = {a.name for a in self._launch.recorder.arrays}
        if match and text.count("shared.array") == 1 and match.group(1) not in taken:
            return match.group(1)
        k = 0
        while f"shared#{k}" in taken:
            k += 1
        return f"shared#{k}"


def _numpy_dtype(dtype) -> np.dtype:
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(dtype, types.Type):
        return numpy_support.as_dtype(dtype)
    return np.dtype(dtype)


def _traced_atomic(name: str):
    base = getattr(FakeCUDAAtomic, name)

    def op(self, array, index, *values):
        if isinstance(array, TracedArray):
            array = array._atomic(index, sys._getframe(1))
        return base(self, array, index, *values)

    op.__name__ = name
    op.__doc__ = f"cuda.atomic.{name}, logged as an atomic access."
    return op


class TracedAtomic(FakeCUDAAtomic):
    """cuda.atomic: the simulator's atomics, each logged as one atomic access."""

    def compare_and_swap(self, array, old, val):
        if isinstance(array, TracedArray):
            array = array._atomic((0,) * array.ndim, sys._getframe(1))
        return super().compare_and_swap(array, old, val)


if _IMPORT_ERROR is None:
    for _name in ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min",
                  "nanmax", "nanmin", "cas"):
        if hasattr(FakeCUDAAtomic, _name):
            setattr(TracedAtomic, _name, _traced_atomic(_name))


class TracedCudaModule(FakeCUDAModule):
    """What the name `cuda` means inside a traced kernel."""

    def __init__(self, launch, grid_dim, block_dim, shared_bytes: int = 0):
        super().__init__(grid_dim, block_dim, shared_bytes)
        self._launch = launch
        self._traced_shared = TracedShared(launch, shared_bytes)
        self._traced_atomic = TracedAtomic()

    @property
    def shared(self):
        return self._traced_shared

    @property
    def atomic(self):
        return self._traced_atomic

    @property
    def threadIdx(self):  # CUDA's name
        return self._launch.recorder.current.threadIdx

    @property
    def blockIdx(self):  # CUDA's name
        return self._launch.recorder.current.blockIdx

    @property
    def laneid(self):
        return self._launch.recorder.current.thread_id % 32

    def syncthreads(self):
        self._launch.recorder.current.syncthreads(sys._getframe(1))

    def syncthreads_count(self, val):
        return self._launch.recorder.current.syncthreads(sys._getframe(1), val, "count")

    def syncthreads_and(self, val):
        return self._launch.recorder.current.syncthreads(sys._getframe(1), val, "and")

    def syncthreads_or(self, val):
        return self._launch.recorder.current.syncthreads(sys._getframe(1), val, "or")


# ----------------------------------------------------------------------------- the kernel


def python_function(kernel):
    """The plain Python function behind a @cuda.jit kernel (simulated or real) or itself."""
    fn = getattr(kernel, "py_func", kernel)
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise TypeError(f"expected a @cuda.jit kernel or a Python function, got {kernel!r}")
    return fn


def device_function(obj):
    """The Python function of a @cuda.jit(device=True) function, else None."""
    try:
        py_func = getattr(obj, "py_func", None)
        if py_func is None:
            return None
        if getattr(obj, "_device", False) is True:  # the simulator's FakeCUDAKernel
            return py_func
        options = getattr(obj, "targetoptions", None)  # the real CUDADispatcher
        if isinstance(options, dict) and options.get("device"):
            return py_func
    except Exception:  # an object with an unusual __getattr__ is not a device function
        return None
    return None


@contextmanager
def swapped_cuda(fn, fake_module, copy=None):
    """Inside: `cuda` means `fake_module` in `fn` and in every device function it calls
    (module globals and closure cells), and device functions are their plain Python selves,
    or `copy(function)` of them when given (loops.LoopTurns.instrumented).

    Like the simulator's `swapped_cuda_module`, but it follows device functions itself, so it
    works where numba.cuda is the real driver (whose device functions Python cannot call)."""
    import numba.cuda as real_cuda

    saved_globals: list[tuple[dict, str, object]] = []
    saved_cells: list[tuple[object, object]] = []
    swapped: set[tuple[int, str]] = set()  # (id of a globals dict, name) already replaced
    seen_fns: set[int] = set()

    def replacement(value):
        if value is real_cuda:
            return fake_module
        device_fn = device_function(value)
        return copy(device_fn) if copy is not None and device_fn is not None else device_fn

    def visit(f):
        if id(f) in seen_fns:
            return
        seen_fns.add(id(f))
        follow = []
        g = f.__globals__
        for name in _global_names(f.__code__):
            if name in g and (id(g), name) not in swapped:
                new = replacement(g[name])
                if new is not None:
                    swapped.add((id(g), name))
                    saved_globals.append((g, name, g[name]))
                    g[name] = new
                    follow.append(new)
        for cell in f.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            new = replacement(value)
            if new is not None:
                saved_cells.append((cell, value))
                cell.cell_contents = new
                follow.append(new)
        for new in follow:
            if new is not fake_module:
                visit(new)

    try:
        visit(fn)
        yield
    finally:
        for g, name, value in reversed(saved_globals):
            g[name] = value
        for cell, value in reversed(saved_cells):
            cell.cell_contents = value


def _global_names(code) -> set[str]:
    """Names a function's code (and the comprehensions and lambdas inside it) looks up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names
