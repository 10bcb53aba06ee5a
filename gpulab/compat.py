"""Small fixes for library versions the course meets on learners' machines, installed by
`import gpulab` before anything imports numba.cuda.

numba-cuda (the package behind `numba.cuda` on a real GPU) registers a typing overload for
`np.row_stack` when it first compiles a kernel. NumPy 2.5 removed that alias of `np.vstack`,
and older numba-cuda releases then fail every kernel launch with
"AttributeError: module 'numpy' has no attribute 'row_stack'" (seen with numba 0.68 and
NumPy 2.5.2 on an H100). Putting the alias back is what those releases expect.
"""

from __future__ import annotations


def install() -> None:
    """Apply the fixes this environment needs; each is a no-op where it is not needed."""
    import numpy as np

    if "row_stack" not in vars(np):  # NumPy >= 2.5; getattr would raise through __getattr__
        np.row_stack = np.vstack
