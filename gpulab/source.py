"""Show the library's own code inside a lesson, so lessons never paste a copy that can drift."""

from __future__ import annotations

import inspect
from pathlib import Path


def source_of(obj) -> str:
    """The source of a function, class, module or Numba kernel, headed by its file and line."""
    obj = getattr(obj, "py_func", obj)  # a @cuda.jit kernel wraps the Python function it runs
    obj = inspect.unwrap(obj)  # a decorated one (@contextmanager, @torch.no_grad): its own code
    lines, first = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj))
    parts = path.parts
    where = "/".join(parts[parts.index("gpulab"):]) if "gpulab" in parts else path.name
    return f"# {where}, line {max(first, 1)}\n" + "".join(lines)


def show_source(obj) -> None:
    """Print the source of `obj` (a gpulab function, class or module)."""
    print(source_of(obj))
