"""Recording memory: an array stand-in that logs every element a CUDA thread reads or writes.

A traced launch hands the kernel a `TracedArray` for each array argument (global memory) and
for each cuda.shared.array (shared memory). Indexing one logs a raw record and then does what
the simulator would do with the underlying NumPy array, so the kernel computes the same values.

A raw record is a plain tuple, cheap to append in the hot path; trace.py turns records into
`Access` values only when someone looks at them:

    (block_lin, thread_lin, array_id, flat, kind, epoch, ordinal, line, code_object, path)

`flat` is the element's C-order position in the array's own shape, `ordinal` the access's
position among this thread's accesses since its last barrier (races.py uses it to tell which
of two racing accesses the program means to come first), `path` the instruction and the turn
of each loop around it (loops.py: what lines up the accesses of a warp's threads).
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass

import numpy as np

from gpulab.sim.records import ATOMIC, READ, WRITE, OutOfBoundsError, format_coord

KIND_NAMES = (READ, WRITE, ATOMIC)  # a record's `kind` is an index into this
READ_K, WRITE_K, ATOMIC_K = 0, 1, 2


class Aborted(BaseException):
    """Raised inside a kernel thread to unwind it when the launch is abandoned. A BaseException,
    so that a kernel's own `except Exception` cannot swallow it."""


@dataclass(frozen=True)
class ArrayInfo:
    """An array the kernel touched."""

    name: str  # kernel parameter name, or the shared array's variable name
    space: str  # "global" or "shared"
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


class Recorder:
    """The log of one launch, and who is running now. Kernel threads run one at a time (see
    scheduler.py), so `current` is always the thread that is indexing."""

    def __init__(self):
        self.records: list[tuple] = []
        self.arrays: list[ArrayInfo] = []
        self.current = None  # the running KernelThread: block_lin, thread_lin, epoch, ordinal
        self.loops = None  # the launch's loops.LoopTurns: each access's path
        self.aborted = False

    def add_array(self, name: str, space: str, shape, dtype) -> int:
        self.arrays.append(ArrayInfo(name, space, tuple(shape), np.dtype(dtype)))
        return len(self.arrays) - 1


class TracedArray:
    """A NumPy array seen through a kernel's eyes: element reads and writes are logged.

    `flat_map` is None for a whole array; for a view made by partial indexing (`x[i]` of a 2-D
    `x`) it maps the view's elements to positions in the whole array, so accesses through the
    view are logged against the array they really touch."""

    __slots__ = ("_data", "_rec", "_aid", "_flat_map", "shape", "ndim", "size", "dtype")

    def __init__(self, data: np.ndarray, recorder: Recorder, aid: int, flat_map=None):
        self._data = data
        self._rec = recorder
        self._aid = aid
        self._flat_map = flat_map  # (size,) int64, or None
        self.shape = data.shape
        self.ndim = data.ndim
        self.size = data.size
        self.dtype = data.dtype

    # -- what a kernel does with an array

    def __getitem__(self, idx):
        flat = self._record(idx, READ_K, sys._getframe(1))
        if flat is None:  # not one element: a view, whose own accesses will be logged
            return self._view(idx)
        return self._data[idx]

    def __setitem__(self, idx, value):
        flat = self._record(idx, WRITE_K, sys._getframe(1))
        if flat is None:  # a slice assignment writes every element of the slice
            frame = sys._getframe(1)
            for f in self._positions()[idx].ravel().tolist():
                self._log(f, WRITE_K, frame)
        self._data[idx] = value

    def __len__(self):
        return self.shape[0]

    def __iter__(self):  # `for v in x:` reads element by element (rows, for 2-D and up)
        for i in range(self.shape[0]):
            if self.ndim > 1:
                yield self._view(i)
            else:  # f_back of a generator is whoever asked for the next value: the kernel
                self._record(i, READ_K, sys._getframe().f_back)
                yield self._data[i]

    def __getattr__(self, name):  # strides, itemsize, T, ...: not memory accesses
        return getattr(self._data, name)

    def __repr__(self):
        info = self._rec.arrays[self._aid]
        return f"<traced {info.space} array {info.name} {self.shape} {self.dtype}>"

    # -- logging

    def _record(self, idx, kind: int, frame):
        """Log one access to element `idx` and return its flat position in the whole array;
        None when `idx` names more than one element (a row, a slice). Raises OutOfBoundsError
        for an integer index past the end, even in a partial index like `x[i]` of a 2-D x."""
        if type(idx) is not tuple:
            idx = (idx,)
        whole = len(idx) == self.ndim  # one integer per axis names one element
        flat = 0
        for axis, (i, n) in enumerate(zip(idx, self.shape, strict=False)):
            try:
                i = operator.index(i)
            except TypeError:  # a slice, an index array, None, ...
                whole = False
                continue
            if i < 0:  # Numba wraps negative indices around, like NumPy
                i += n
            if not 0 <= i < n:
                self._out_of_bounds(idx, axis, kind, frame)
            flat = flat * n + i
        if not whole:
            return None
        if self._flat_map is not None:
            flat = int(self._flat_map[flat])
        self._log(flat, kind, frame)
        return flat

    def _log(self, flat: int, kind: int, frame):
        rec = self._rec
        if rec.aborted:
            raise Aborted
        t = rec.current
        rec.records.append((t.block_lin, t.thread_lin, self._aid, flat, kind, t.epoch,
                            t.ordinal, frame.f_lineno, frame.f_code,
                            rec.loops.path_of(frame, t.turns) if rec.loops else None))
        t.ordinal += 1
        t.budget -= 1
        if t.budget <= 0:  # a long run without a barrier: let the others have a turn
            t.pause()

    def _atomic(self, idx, frame) -> np.ndarray:
        """Log an atomic update of element `idx`; return the NumPy array to apply it to."""
        if self._record(idx, ATOMIC_K, frame) is None:
            raise TypeError(f"cuda.atomic needs the index of one element, got {idx!r}")
        return self._data

    def _positions(self) -> np.ndarray:
        """Each element's flat position in the whole array, in this view's shape."""
        if self._flat_map is None:
            return np.arange(self.size).reshape(self.shape)
        return self._flat_map.reshape(self.shape)

    def _view(self, idx):
        data = self._data[idx]
        if not isinstance(data, np.ndarray):  # e.g. a record field: nothing more to follow
            return data
        return TracedArray(data, self._rec, self._aid, self._positions()[idx].ravel())

    def _out_of_bounds(self, idx, axis: int, kind: int, frame):
        info = self._rec.arrays[self._aid]
        t = self._rec.current
        n = self.shape[axis]
        verb = {READ_K: "reads", WRITE_K: "writes", ATOMIC_K: "atomically updates"}[kind]
        where = f"line {frame.f_lineno}"
        code = _source_line(frame.f_code.co_filename, frame.f_lineno)
        if code:
            where += f" (`{code}`)"
        shown = ", ".join(str(i) for i in idx)
        self._rec.aborted = True  # stop the other threads at their next access
        raise OutOfBoundsError(
            f"thread {format_coord(t.thread)} of block {format_coord(t.block)} {verb} "
            f"{info.name}[{shown}] on {where}, but {info.name} has shape {self.shape}: along "
            f"axis {axis} the valid indices are 0..{n - 1}. On a GPU nothing would stop this: "
            "the access would touch another buffer or crash later with an illegal address. "
            f"Guard it, e.g. `if i < {info.name}.shape[{axis}]:`, or launch fewer threads.")


def _source_line(filename: str, lineno: int) -> str:
    import linecache

    return linecache.getline(filename, lineno).strip()
