"""Whose code a file holds: the learner's (a notebook cell, a module of their own), or not (the
standard library, installed packages such as torch and Numba, gpulab itself).

    is_learners("/tmp/ipykernel_7/123.py")              True: a notebook cell
    is_learners(torch.__file__)                         False
    LIBRARY_DIR                                         gpulab's own folder

The one test of it for every checker: the short traceback shows the learner's line
(short_traceback.py), a rank's failure quotes the learner's frames (ranks.py), and "is it their
own function" starts from LIBRARY_DIR (owned.py). Paths may come from another process (a rank's
traceback, as text): a path under any site-packages or lib/pythonX.Y folder is not theirs either.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

# gpulab's folder, found from this file rather than by importing gpulab (which imports the
# checks' registry through progress(), and so this module).
LIBRARY_DIR = Path(__file__).resolve().parents[2]
LIBRARY_DIRS = tuple(sorted({
    os.path.realpath(path) + os.sep
    for path in (*(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib",
                                                           "platlib")),
                 str(LIBRARY_DIR))
}))
# The same kinds of folder in another interpreter's paths, as a rank's traceback names them.
LIBRARY_PARTS = ("/site-packages/", "/dist-packages/",
                 f"/lib/python{sys.version_info.major}.{sys.version_info.minor}/")


def is_learners(filename: str) -> bool:
    """True for a file of the learner's code: a notebook cell or a module of their own."""
    if filename.startswith("<"):  # <frozen ...>, <string>: generated, not written by them
        return False
    if os.path.realpath(filename).startswith(LIBRARY_DIRS):
        return False
    return not any(part in filename.replace("\\", "/") for part in LIBRARY_PARTS)
