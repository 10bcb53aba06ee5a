"""Is the graded code the learner's own? A lab grades what the learner wrote in the notebook:
gpulab's version of a kernel, function or class, imported instead, earns no points, and the
checker says so before it runs anything.

    require_own_kernel(saxpy, "saxpy")        a @cuda.jit kernel written in the notebook
    require_own_function(amp_step, "amp_step")
    require_own_class(SimpleDDP, "SimpleDDP")  not gpulab's, not torch's DDP, nor a subclass
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpulab.checks.harness.whose import LIBRARY_DIR


def defined_in_library(fn) -> bool:
    """True when a Python function's code comes from the gpulab package (imported, not written)."""
    module = getattr(fn, "__module__", None) or ""
    code = getattr(fn, "__code__", None)
    filename = Path(code.co_filename).resolve() if code is not None else None
    in_dir = filename is not None and LIBRARY_DIR in filename.parents
    return module == "gpulab" or module.startswith("gpulab.") or in_dir


def require_own_kernel(kernel, name: str) -> None:
    """AssertionError unless `kernel` is a @cuda.jit kernel whose function was written outside
    gpulab (in the notebook)."""
    py_func = getattr(kernel, "py_func", None)
    if py_func is None or not hasattr(type(kernel), "__getitem__"):
        raise AssertionError(
            f"{name} is not a CUDA kernel (it is a {type(kernel).__name__}). Put @cuda.jit on "
            f"the line above `def {name}(...)` and run that cell again.")
    if defined_in_library(py_func):
        where = f"{py_func.__module__}.{getattr(py_func, '__name__', '?')}"
        raise AssertionError(
            f"{name} is gpulab's {where}: define your own kernel in the notebook; importing "
            "gpulab's version earns no points.")


def require_own_function(fn, name: str) -> None:
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise AssertionError(f"{name} is not a function (it is a {type(fn).__name__}). Define "
                             f"it with `def {name}(...)` and run that cell again.")
    if defined_in_library(fn):
        raise AssertionError(f"{name} is gpulab's {fn.__module__}.{fn.__name__}: write your "
                             "own in the notebook; importing gpulab's version earns no points.")


def require_own_class(cls, name: str) -> None:
    """AssertionError unless `cls` is a class written in the notebook: not gpulab's, not torch's
    DistributedDataParallel, and not a subclass of either."""
    if not isinstance(cls, type):
        raise AssertionError(f"{name} is not a class (it is a {type(cls).__name__}). Define it "
                             f"with `class {name}(nn.Module):` and run that cell again.")
    for base in cls.__mro__:
        module = getattr(base, "__module__", "") or ""
        if module == "gpulab" or module.startswith("gpulab."):
            raise AssertionError(f"{name} is (or extends) gpulab's {module}.{base.__name__}: "
                                 "write your own in the notebook; gpulab's earns no points.")
        if base is torch.nn.parallel.DistributedDataParallel:
            raise AssertionError(f"{name} extends torch's DistributedDataParallel: build the "
                                 "wrapper yourself from torch.distributed's collectives.")
    for attr in vars(cls).values():
        fn = getattr(attr, "__func__", attr)
        if hasattr(fn, "__code__") and defined_in_library(fn):
            raise AssertionError(f"{name}.{fn.__name__} is gpulab's {fn.__module__}."
                                 f"{fn.__name__}: write your own in the notebook.")
