"""A @cuda.jit kernel as data, to trace it in another process: its bytecode, the values of the
globals and closure cells it reads, the device functions it calls (packed the same way), and
the source lines of their files, so that the copy's trace names the same lines and lines up a
warp's loop turns as the original's would (loops.py compiles its copy from that source).

    data = pack_kernel(kernel)      # bytes: a real CUDA dispatcher, or the simulator's kernel
    kernel = unpack_kernel(data)    # in a process where numba.cuda is Numba's CUDA simulator

The bytecode travels as it is (marshal: both processes run the same interpreter), so the copy
runs exactly the code the original runs. What a kernel reads travels by value: modules by name
(`numba.cuda` is the simulator's in the copy), device functions as packed functions, anything
else (numbers, NumPy arrays, Numba types) pickled. A value that cannot be pickled raises
NotPortable, which names it.
Used by gpulab.checks.harness.simulator_process (the gpu runner's technique verdicts).
"""

from __future__ import annotations

import builtins
import dis
import importlib
import linecache
import marshal
import pickle
import types
from dataclasses import dataclass

from gpulab.sim.device import device_function, python_function


class NotPortable(TypeError):
    """The kernel reads a value that cannot be sent to another process; the message names it."""


@dataclass(frozen=True)
class ModuleRef:
    """A module, imported by name where the kernel is unpacked."""

    name: str


@dataclass(frozen=True)
class FunctionRef:
    """One of the packed functions, by its place in PackedKernel.functions."""

    index: int


@dataclass(frozen=True)
class Pickled:
    """Any other value, pickled on its own (so that a failure names the value)."""

    data: bytes


EMPTY_CELL = None  # a closure cell with nothing in it yet


@dataclass(frozen=True)
class PackedFunction:
    """One Python function of a kernel: the kernel itself or a device function it calls."""

    name: str
    module: str  # its globals' __name__
    code: bytes  # marshal.dumps of its code object
    device: bool  # a @cuda.jit(device=True) function, not the kernel
    globals: dict  # name -> ModuleRef | FunctionRef | Pickled, for each global it loads
    closure: tuple  # one packed value (or EMPTY_CELL) per free variable
    defaults: tuple | None  # packed default values


@dataclass(frozen=True)
class PackedKernel:
    functions: tuple  # PackedFunction; functions[0] is the kernel
    sources: dict  # file name -> its lines, as linecache holds them here


def pack_kernel(kernel) -> bytes:
    """The kernel (a @cuda.jit dispatcher, real or simulated) as bytes for unpack_kernel."""
    packer = _Packer()
    packer.function(python_function(kernel), device=False)
    return pickle.dumps(PackedKernel(tuple(packer.functions), packer.sources))


def unpack_kernel(data: bytes):
    """The kernel pack_kernel packed, as a @cuda.jit kernel of this process's numba.cuda."""
    from numba import cuda

    packed: PackedKernel = pickle.loads(data)
    for file, lines in packed.sources.items():  # mtime None: linecache keeps the entry
        linecache.cache[file] = (sum(map(len, lines)), None, list(lines), file)
    functions, jitted = [], []
    for p in packed.functions:  # first every function, so that each may refer to any other
        code = marshal.loads(p.code)
        cells = tuple(types.CellType() for _ in code.co_freevars)
        fn = types.FunctionType(code, {"__builtins__": builtins, "__name__": p.module}, p.name,
                                None, cells)
        functions.append(fn)
        jitted.append(cuda.jit(device=True)(fn) if p.device else cuda.jit(fn))

    def value(v):
        if isinstance(v, ModuleRef):
            return importlib.import_module(v.name)
        if isinstance(v, FunctionRef):
            return jitted[v.index]
        return pickle.loads(v.data)

    for p, fn in zip(packed.functions, functions, strict=True):
        fn.__globals__.update({name: value(v) for name, v in p.globals.items()})
        for cell, v in zip(fn.__closure__ or (), p.closure, strict=True):
            if v is not EMPTY_CELL:
                cell.cell_contents = value(v)
        if p.defaults is not None:
            fn.__defaults__ = tuple(value(v) for v in p.defaults)
    return jitted[0]


class _Packer:
    def __init__(self):
        self.functions: list[PackedFunction | None] = []
        self.sources: dict[str, list[str]] = {}
        self._index: dict[int, int] = {}  # id of a Python function -> its place

    def function(self, fn, device: bool) -> FunctionRef:
        if id(fn) in self._index:
            return FunctionRef(self._index[id(fn)])
        index = self._index[id(fn)] = len(self.functions)
        self.functions.append(None)  # its place, taken before what it calls takes theirs
        code = fn.__code__
        file = code.co_filename
        if file not in self.sources:
            self.sources[file] = linecache.getlines(file, fn.__globals__)
        where = f"{fn.__name__} ({file})"
        globals_ = {name: self.value(fn.__globals__[name], f"the global `{name}` of {where}")
                    for name in sorted(_loaded_globals(code)) if name in fn.__globals__}
        closure = tuple(self._cell(cell, f"`{name}` of {where}")
                        for name, cell in zip(code.co_freevars, fn.__closure__ or (),
                                              strict=True))
        defaults = (None if fn.__defaults__ is None else
                    tuple(self.value(v, f"a default of {where}") for v in fn.__defaults__))
        self.functions[index] = PackedFunction(
            name=fn.__name__, module=fn.__globals__.get("__name__", "__main__"),
            code=marshal.dumps(code), device=device, globals=globals_, closure=closure,
            defaults=defaults)
        return FunctionRef(index)

    def _cell(self, cell, what: str):
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not filled yet
            return EMPTY_CELL
        return self.value(contents, what)

    def value(self, v, what: str):
        if isinstance(v, types.ModuleType):
            return ModuleRef(v.__name__)
        device_fn = device_function(v)
        if device_fn is not None:
            return self.function(device_fn, device=True)
        try:
            return Pickled(pickle.dumps(v))
        except Exception as error:  # anything pickle refuses: say which value it was
            raise NotPortable(
                f"{what} is a {type(v).__name__}, which cannot be sent to another process "
                f"({type(error).__name__}: {error}). A kernel may read numbers, arrays, Numba "
                "types, modules and @cuda.jit(device=True) functions.") from error


def _loaded_globals(code) -> set[str]:
    """The global names a code object (and the code nested in it) loads."""
    names = {i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _loaded_globals(const)
    return names
