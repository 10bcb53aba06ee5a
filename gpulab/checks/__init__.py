"""The checkers that lab test cells call, one package per graded assignment, on a small harness.

    from gpulab.checks.lab1 import check_block_sum        # what a test cell does
    check_block_sum(block_sum, sizes=[256, 1000])

harness/    what every checker stands on: is it the learner's own code, run a kernel, run code on
            ranks and record its collectives, training comparisons, numbers and tolerances
lab1/ ... lab5/, quiz/, capstone/
            one package per assignment: its __init__ holds the ASSIGNMENT table (parts and
            points, table.py) and exports the checkers; one module per part
keys.py     the expected answers of numeric questions, computed from the library by the grader
            outside the learner's kernel (answer_key)

Each checker runs the learner's code itself, compares plain results with a reference, and fails
with an AssertionError that teaches: which case, what came out against what was expected, and
the likely cause. In a notebook that failure shows as its message and the learner's line, not
IPython's traceback through the checker (harness/short_traceback.py, installed by the harness
when a lab's package first imports it). No lab package imports another; importing this package
imports nothing heavy and changes nothing in IPython.
"""

from __future__ import annotations

import importlib

# Assignment name -> its package under gpulab.checks: the one list of graded notebooks.
PACKAGES = {
    "lab1_cuda_kernels": "lab1",
    "lab2_amp_training": "lab2",
    "lab3_ddp_from_scratch": "lab3",
    "lab4_memory_and_profiling": "lab4",
    "lab5_parallelism_across_nodes": "lab5",
    "quiz": "quiz",
    "capstone_distributed_gpt": "capstone",
}


def find_lab(lab) -> str:
    """The full name of `lab`, given as "lab1", "lab1_cuda_kernels", 1, "quiz" or "capstone"."""
    key = str(lab).strip().lower()
    if key.isdigit():
        key = f"lab{key}"
    found = [name for name in PACKAGES if name == key or name.split("_", 1)[0] == key]
    if len(found) != 1:
        raise ValueError(f"no lab {lab!r}: choose one of {', '.join(PACKAGES)} (or lab1 ... "
                         "lab5).")
    return found[0]


def package(lab):
    """The checkers' package of `lab` (imports its checkers: torch, and numba for Lab 1)."""
    return importlib.import_module(f"gpulab.checks.{PACKAGES[find_lab(lab)]}")


def assignment(lab):
    """`lab`'s Assignment: its parts, points and hand-graded cells (gpulab/checks/table.py)."""
    return package(lab).ASSIGNMENT


def find_parts(lab, part: str | None = None):
    """Every part of `lab`, or the one named `part` (its name, or its test cell's grade_id)."""
    parts = assignment(lab).parts
    if part is None:
        return parts
    chosen = tuple(p for p in parts if part in (p.name, p.grade_id))
    if not chosen:
        raise ValueError(f"{lab} has no part {part!r}: its parts are "
                         f"{', '.join(p.name for p in parts)}.")
    return chosen
