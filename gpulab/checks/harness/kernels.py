"""Running a learner's CUDA kernel for a checker, and reading plain results back.

A checker never trusts the learner's objects: it builds the inputs itself, launches the kernel
itself and grades NumPy copies of what came back. Every failure is an AssertionError whose
message says which case failed, what came out against what was expected, and what to look at.

    require_own_kernel(saxpy, "saxpy")               # a @cuda.jit kernel written in the notebook
    out = GuardedOutput((n,), np.float32, np.nan)    # device buffer with spare cells past the end
    launch(saxpy, "saxpy", blocks, threads_per_block, out.view, a, d_x, d_y, case="n=1000")
    got = out.result("saxpy", case="n=1000")         # float64 copy; a write past the end fails
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
from numba import cuda

import gpulab
from gpulab.stubs import is_stub_error, not_started

GUARD = 8  # spare cells after each dimension of an output: a write past the end lands there
STUB_HINT = "Replace `raise NotImplementedError()` with your kernel's code."

# The simulator runs each CUDA thread as a Python thread and waits for a barrier in a loop that
# holds the GIL; a short switch interval lets the waiting threads run sooner (about 3x faster
# for kernels with cuda.syncthreads()). Restored after every launch.
SIMULATOR_SWITCH_INTERVAL_S = 1e-4


@contextmanager
def simulator_pace():
    """Run the body with a short GIL switch interval on the simulator (see above)."""
    if not gpulab.runner.simulator:
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def error_hint(error: Exception) -> str:
    if isinstance(error, IndexError):
        return ("A thread indexed past the end of an array. Guard with `if i < n` (strictly "
                "less: the last valid index is n - 1), and in 2-D check each index against its "
                "own dimension (the row against shape[0], the column against shape[1]).")
    if type(error).__name__ in ("TypingError", "LoweringError", "NumbaError"):
        return ("Numba could not compile the kernel for the GPU; the message above names the "
                "line. Kernels may only use numbers, arrays and the cuda.* functions.")
    if isinstance(error, NotImplementedError):
        return STUB_HINT
    if type(error).__name__ == "KernelTimeout":
        return ("The kernel ran past its time limit: look for a loop that never ends (a "
                "`while` whose index never grows, or a stride of 0).")
    return "Look at the line of your kernel that raised it."


def kernel_failed(name: str, where: str, error: Exception) -> AssertionError:
    """The checker's error for a kernel that raised `error`: "not started" for the lab's stub,
    else what it raised and what to check. Raise it `from error`: IPython's %tb shows both."""
    if is_stub_error(error):
        return AssertionError(not_started(name, STUB_HINT))
    return AssertionError(f"{where} raised {type(error).__name__}: {error}\n{error_hint(error)}")


def launch(kernel, name: str, blocks, threads_per_block, *args, case: str = "") -> None:
    """kernel[blocks, threads_per_block](*args), waited for; an error becomes an AssertionError
    that says which case failed and what to check."""
    try:
        with simulator_pace():
            kernel[blocks, threads_per_block](*args)
            cuda.synchronize()
    except Exception as error:  # the learner's code may raise anything; say what it means
        where = f"{name} ({case}, blocks={blocks}, threads_per_block={threads_per_block})"
        raise kernel_failed(name, where, error) from error


def check_races(kernel, name: str, blocks, threads_per_block, *args, case: str = "") -> None:
    """Run the kernel once under gpulab.sim's race detector (host arrays in `args`): a data race,
    a missing cuda.syncthreads() or a barrier not every thread reaches becomes an AssertionError
    that names the kernel and the case; any other error is reported as `launch` does."""
    from gpulab.sim import check_no_races  # the tracing simulator: loaded only when used

    where = f"{name} ({case}, blocks={blocks}, threads_per_block={threads_per_block})"
    try:
        with simulator_pace():
            check_no_races(kernel, blocks, threads_per_block, *args)
    except AssertionError as error:  # RaceError: its message already says what went wrong
        raise AssertionError(f"{where}: {error}") from error
    except Exception as error:
        raise kernel_failed(name, where, error) from error


class GuardedOutput:
    """An output array on the device with GUARD spare cells past the end of each dimension.

    The kernel gets `view`, an array of exactly `shape`. On the simulator a write past the end
    raises IndexError; on a GPU nothing stops it, so it lands in the spare cells and `result`
    reports it. Every cell starts as `fill` (NaN for floats: a cell the kernel never wrote
    stays NaN, which tells "never written" from "wrong").
    """

    def __init__(self, shape: tuple[int, ...], dtype, fill):
        self.shape = tuple(int(s) for s in shape)
        self.fill = fill
        padded = np.full([s + GUARD for s in self.shape], fill, dtype=dtype)
        self.buffer = cuda.to_device(padded)
        self.view = self.buffer[tuple(slice(0, s) for s in self.shape)]

    def result(self, name: str, case: str = "", dtype=np.float64) -> np.ndarray:
        """A plain NumPy copy of the output, as `dtype`; AssertionError if the kernel wrote into
        the spare cells past the end."""
        host = np.array(self.buffer.copy_to_host(), dtype=dtype)  # a copy we own
        inside = tuple(slice(0, s) for s in self.shape)
        spare = np.ones(host.shape, dtype=bool)
        spare[inside] = False
        changed = spare & ~_same(host, self.fill)
        if changed.any():
            where = tuple(int(i) for i in np.argwhere(changed)[0])
            raise AssertionError(
                f"{name} ({case}) wrote past the end of its output: index {fmt_index(where)} of "
                f"an array of shape {self.shape}. Guard with `if i < n` (strictly less), and in "
                "2-D check the row against shape[0] and the column against shape[1].")
        return host[inside].copy()


def _same(values: np.ndarray, fill) -> np.ndarray:
    if isinstance(fill, float) and np.isnan(fill):
        return np.isnan(values)
    return values == fill


def fmt_index(index) -> str:
    """(3,) -> "[3]", (2, 5) -> "[2, 5]": how a learner writes the index in the kernel."""
    index = index if isinstance(index, tuple) else (index,)
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def bad_indices(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Indices (k, ndim) where got differs from want; NaN in got (never written) counts as bad."""
    return np.argwhere(~np.isclose(got, want, rtol=rtol, atol=atol))
