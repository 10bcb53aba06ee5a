"""Run a real @cuda.jit kernel and record what every thread reads and writes.

    from gpulab.sim import run_traced
    trace = run_traced(matmul_kernel_v1, (2, 2), (16, 16), c, a, b)   # like kernel[blocks, tpb]
    trace.global_bytes_read            # 2 * 32**3 * 4 for a naive 32x32 float32 matmul
    trace.bytes_by_array               # {"c": ..., "a": ..., "b": ...}
    trace.races, trace.barrier_errors  # see races.py
    trace.draw_access("c", by="block") # which block wrote which cell of C

The kernel runs from its Python function (`kernel.py_func`), one CUDA thread at a time (see
scheduler.py), with NumPy arrays standing in for device memory: they are modified in place, as
a device array would be, and hold the same values the simulator or a GPU would compute.
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import inspect
import linecache
from collections import Counter
from contextlib import contextmanager
from functools import cached_property

import numpy as np

from gpulab.sim.device import TracedCudaModule, python_function, require_simulator, swapped_cuda
from gpulab.sim.loops import LoopTurns
from gpulab.sim.memory import ATOMIC_K, KIND_NAMES, READ_K, WRITE_K, ArrayInfo, TracedArray
from gpulab.sim.races import explain, races_in
from gpulab.sim.records import Access, RaceError
from gpulab.sim.scheduler import Launch

MAX_THREADS_PER_BLOCK = 1024  # what every CUDA GPU since 2010 allows


def launch_dims(value, what: str) -> tuple[int, ...]:
    """`blocks` or `threads_per_block` as a tuple of 1-3 positive ints, as CUDA takes them."""
    dims = (value,) if np.ndim(value) == 0 else tuple(value)
    if not 1 <= len(dims) <= 3 or any(int(d) != d or int(d) < 1 for d in dims):
        raise ValueError(f"{what}={value!r}: expected a positive int or a tuple of 1-3 of them")
    return tuple(int(d) for d in dims)


def run_traced(kernel, blocks, threads_per_block, *args, shared_bytes: int = 0,
               timeout_s: float = 120.0) -> Trace:
    """Launch `kernel[blocks, threads_per_block](*args)` and record every memory access.

    args: NumPy arrays (global memory, modified in place) and scalars; the simulator's device
    arrays (cuda.to_device) work too. shared_bytes: dynamic shared memory, as the 4th launch
    argument `kernel[blocks, tpb, 0, shared_bytes]`. Raises OutOfBoundsError for an index past
    an array's end, KernelTimeout past `timeout_s`, and whatever the kernel raises.
    """
    require_simulator()
    fn = python_function(kernel)
    blocks = launch_dims(blocks, "blocks")
    threads_per_block = launch_dims(threads_per_block, "threads_per_block")
    if int(np.prod(threads_per_block)) > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"threads_per_block={threads_per_block} is "
                         f"{int(np.prod(threads_per_block))} threads; a CUDA block holds at most "
                         f"{MAX_THREADS_PER_BLOCK}, and a GPU would refuse this launch")
    launch = Launch(blocks, threads_per_block, timeout_s)
    traced, write_back = _device_args(fn, args, launch)
    module = TracedCudaModule(launch, launch.block3, launch.thread3, shared_bytes)
    loops = launch.recorder.loops = LoopTurns(launch.recorder)
    run = loops.instrumented(fn)  # a copy that says which turn of a loop it is on

    def target():
        run(*traced)

    with swapped_cuda(fn, module, loops.instrumented), _simulator_context(module):
        for lin, block in enumerate(Launch.coords(launch.block3, len(blocks))):
            launch.run_block(target, block, lin, module.shared.new_block)
    for copy_back in write_back:
        copy_back()
    return Trace(fn.__name__, launch)


def find_races(kernel, blocks, threads_per_block, *args, **launch_options) -> list:
    """Run `kernel` traced and return its races (an empty list when it has none)."""
    return run_traced(kernel, blocks, threads_per_block, *args, **launch_options).races


def check_no_races(kernel, blocks, threads_per_block, *args, **launch_options) -> None:
    """Run `kernel` traced; raise RaceError, with a message that teaches, if two threads race
    or a cuda.syncthreads() is not reached by the whole block."""
    trace = run_traced(kernel, blocks, threads_per_block, *args, **launch_options)
    if trace.races or trace.barrier_errors:
        raise RaceError(explain(trace.kernel_name, trace.races, trace.barrier_errors),
                        trace.races, trace.barrier_errors)


def _device_args(fn, args, launch: Launch):
    """Array arguments become TracedArrays named after the kernel's parameters."""
    params = list(inspect.signature(fn).parameters)
    if len(args) != len(params):
        raise TypeError(f"{fn.__name__}({', '.join(params)}) takes {len(params)} arguments, "
                        f"got {len(args)}")
    traced, write_back = [], []
    for name, arg in zip(params, args, strict=True):
        data = arg
        if isinstance(getattr(arg, "_ary", None), np.ndarray):  # the simulator's device array
            data = arg._ary
        elif hasattr(arg, "copy_to_host") and not isinstance(arg, np.ndarray):  # a GPU's
            data = arg.copy_to_host()
            write_back.append(lambda dev=arg, host=data: dev.copy_to_device(host))
        if isinstance(data, np.ndarray) and data.ndim > 0:
            aid = launch.recorder.add_array(name, "global", data.shape, data.dtype)
            traced.append(TracedArray(data, launch.recorder, aid))
        else:
            traced.append(arg)
    return traced, write_back


@contextmanager
def _simulator_context(module):
    """Also be the simulator's current kernel, for device functions that swapped_cuda could
    not see (kept in a list, say): a simulated device function asks the simulator for it."""
    try:
        from numba.cuda.simulator import kernel as sim_kernel

        push = sim_kernel._push_kernel_context
        busy = sim_kernel._get_kernel_context() is not None
    except (ImportError, AttributeError):
        push, busy = None, True
    if busy:
        yield
    else:
        with push(module):
            yield


class Trace:
    """What one traced launch did: every access, the global-memory traffic, races, barriers."""

    def __init__(self, kernel_name: str, launch: Launch):
        self.kernel_name = kernel_name
        self.blocks = launch.blocks  # as launched, e.g. (2, 2)
        self.threads_per_block = launch.threads_per_block  # e.g. (16, 16)
        self.arrays: list[ArrayInfo] = launch.recorder.arrays  # indexed by a record's array id
        self.barrier_errors = launch.barrier_errors  # list[DivergentBarrier]
        self.records = launch.recorder.records  # raw tuples, see memory.py
        self._block_coords = Launch.coords(launch.block3, len(self.blocks))
        self._thread_coords = Launch.coords(launch.thread3, len(self.threads_per_block))
        self._count_traffic()

    # -- traffic

    def _count_traffic(self) -> None:
        """Bytes the kernel asks global memory for, element by element, before any cache.
        An atomic update counts as a read and a write of its element."""
        counts = Counter((r[2], r[4]) for r in self.records)
        self.bytes_read_by_array: dict[str, int] = {}
        self.bytes_written_by_array: dict[str, int] = {}
        self.shared_bytes_read = self.shared_bytes_written = 0
        for aid, info in enumerate(self.arrays):
            atomics = counts[aid, ATOMIC_K]
            read = (counts[aid, READ_K] + atomics) * info.itemsize
            written = (counts[aid, WRITE_K] + atomics) * info.itemsize
            if info.space == "global":
                self.bytes_read_by_array[info.name] = read
                self.bytes_written_by_array[info.name] = written
            else:
                self.shared_bytes_read += read
                self.shared_bytes_written += written
        self.bytes_by_array = {name: self.bytes_read_by_array[name] + written
                               for name, written in self.bytes_written_by_array.items()}
        self.global_bytes_read = sum(self.bytes_read_by_array.values())
        self.global_bytes_written = sum(self.bytes_written_by_array.values())

    @property
    def global_bytes(self) -> int:
        """Global bytes read plus written."""
        return self.global_bytes_read + self.global_bytes_written

    # -- accesses

    @cached_property
    def accesses(self) -> list[Access]:
        """Every access, in the order the threads made them (block by block; within a block,
        barrier interval by interval; within an interval, thread by thread)."""
        return [self.access(r) for r in self.records]

    def access(self, record: tuple) -> Access:
        """The Access of one raw record."""
        blk, thr, aid, flat, kind, epoch, _, line, code, _ = record
        info = self.arrays[aid]
        index = []
        for n in reversed(info.shape):  # unravel the C-order position
            flat, i = divmod(flat, n)
            index.append(i)
        file = code.co_filename
        return Access(block=self._block_coords[blk], thread=self._thread_coords[thr],
                      space=info.space, array=info.name, index=tuple(reversed(index)),
                      kind=KIND_NAMES[kind], epoch=epoch, line=line,
                      code=linecache.getline(file, line).strip(), file=file)

    def array(self, name: str) -> ArrayInfo:
        """The array called `name` (a kernel parameter, else a shared array)."""
        found = sorted((a for a in self.arrays if a.name == name), key=lambda a: a.space)
        if not found:
            names = ", ".join(a.name for a in self.arrays)
            raise KeyError(f"{self.kernel_name} touched no array called {name!r}; it touched "
                           f"{names or 'no arrays'}")
        return found[0]

    def accesses_to(self, name: str, kind: str | None = None) -> list[Access]:
        """The accesses to one array, optionally only "read", "write" or "atomic" ones."""
        aid = self.arrays.index(self.array(name))
        k = None if kind is None else KIND_NAMES.index(kind)
        return [self.access(r) for r in self.records if r[2] == aid and k in (None, r[4])]

    # -- checks (races.py)

    @cached_property
    def races(self):
        """list[Race]: one per element that two unordered threads touch, one of them writing."""
        return races_in(self)

    # -- pictures (draw.py, matplotlib imported only when drawing)

    def touch_grid(self, name: str, kind: str | None = None, by: str = "block",
                   block=None) -> np.ndarray:
        """Per cell of an array: who touched it (see draw.touch_grid)."""
        from gpulab.sim.draw import touch_grid

        return touch_grid(self, name, kind=kind, by=by, block=block)

    def draw_access(self, name: str, **kwargs):
        """Picture of which blocks or threads touched which cells (see draw.draw_access)."""
        from gpulab.sim.draw import draw_access

        return draw_access(self, name, **kwargs)

    def summary(self) -> str:
        lines = [f"{self.kernel_name}[{self.blocks}, {self.threads_per_block}]: "
                 f"{len(self.records)} accesses, global memory {self.global_bytes_read} B read, "
                 f"{self.global_bytes_written} B written"]
        for name, total in self.bytes_by_array.items():
            lines.append(f"  {name}: {self.bytes_read_by_array[name]} B read, "
                         f"{self.bytes_written_by_array[name]} B written ({total} B)")
        if "races" in self.__dict__ or self.barrier_errors:
            lines.append(f"  {len(self.races)} race(s), "
                         f"{len(self.barrier_errors)} divergent barrier(s)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Trace {self.summary().splitlines()[0]}>"
