"""Lab 1 submissions made from the lab's own notebooks, for grading it end to end.

    solution()                       the source notebook, answers and hidden tests included
    released()                       labs/lab1_cuda_kernels as a learner receives it
    with_mistake(MISTAKES[0])        the solution with one part broken the way learners break it
    hand_in(folder, "ada", nb)       folder/ada/lab1_cuda_kernels.ipynb, as a learner hands it in

Each mistake is a string replacement in one answer cell, found by its nbgrader grade_id. The
replaced text must occur exactly once: when the lab's solution changes, building the submission
fails here, loudly, instead of grading an unchanged (correct) notebook and testing nothing.
Not a test module (no `test_` prefix): the Lab 1 grading tests and benchmarks import it.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab1_cuda_kernels"
NOTEBOOK = f"{LAB}.ipynb"
SOLUTION = ROOT / "solutions" / LAB / NOTEBOOK
RELEASE = ROOT / "labs" / LAB / NOTEBOOK

# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_saxpy": 2,
    "test_transpose": 2,
    "test_block_sum": 3,
    "test_matmul_tiled": 4,
    "test_histogram": 3,
    "test_waves": 2,
}
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


@dataclass(frozen=True)
class Mistake:
    """One known-wrong answer: which cell changes, how, and what the grader must say."""

    student_id: str  # the learner who hands it in
    cell: str  # grade_id of the answer cell that changes
    old: str  # text of the solution, found exactly once in that cell
    new: str  # what the learner wrote instead
    test: str  # grade_id of the one test cell that must fail
    teaching: str  # regex: the checker's message about it, which the feedback must show


MISTAKES = (
    Mistake(
        student_id="off_by_one",
        cell="saxpy",
        old="while i < out.size:",
        new="while i <= out.size:",
        test="test_saxpy",
        teaching=r"strictly less: the last valid index is n - 1",
    ),
    Mistake(
        student_id="swapped_transpose",
        cell="transpose",
        old="col, row = cuda.grid(2)",
        new="row, col = cuda.grid(2)",
        test="test_transpose",
        teaching=r"It was never written\. The grid covers a: x runs along a's columns",
    ),
    Mistake(
        student_id="no_barrier",
        cell="block_sum",
        old="        cuda.syncthreads()  # every thread, every step: the next step reads these "
        "sums\n",
        new="",
        test="test_block_sum",
        # The simulator may or may not show this on the visible sizes; the hidden race
        # detector always does, so either message is right.
        teaching=r"cuda\.syncthreads\(\) after loading and after every step|block_sum: data race",
    ),
    Mistake(
        student_id="wrong_tile",
        cell="matmul_tiled",
        old="k = t * TILE + tx\n",
        new="k = tx  # the step t forgotten: a[row, tx] instead of a[row, t * TILE + tx]\n",
        test="test_matmul_tiled",
        teaching=r"Check the tile index: step t loads a\[row, t \* TILE \+ tx\]",
    ),
    Mistake(
        student_id="no_atomics",
        cell="histogram",
        old="cuda.atomic.add(counts, b, 1)",
        new="counts[b] += 1",
        test="test_histogram",
        # Lost counts are likely, not certain, on the simulator: the race detector is.
        teaching=r"Counts were lost\. .* use cuda\.atomic\.add|is a read, an add and a write",
    ),
)


def read(path: Path) -> NotebookNode:
    return nbformat.read(path, as_version=4)


def solution() -> NotebookNode:
    return read(SOLUTION)


def released() -> NotebookNode:
    return read(RELEASE)


def grade_id(cell: NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def cell_by_grade_id(nb: NotebookNode, wanted: str) -> NotebookNode:
    """The one cell of `nb` whose nbgrader grade_id is `wanted`."""
    found = [cell for cell in nb.cells if grade_id(cell) == wanted]
    if len(found) != 1:
        raise LookupError(f"{len(found)} cells with grade_id {wanted!r} in the notebook")
    return found[0]


def points_of(nb: NotebookNode) -> dict[str, float]:
    """grade_id -> points of every autograded test cell of `nb`."""
    return {
        grade_id(c): float(c.metadata["nbgrader"]["points"])
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"
    }


def with_mistake(mistake: Mistake, nb: NotebookNode | None = None) -> NotebookNode:
    """The solution (or `nb`) with `mistake` made in its answer cell."""
    nb = nb if nb is not None else solution()
    cell = cell_by_grade_id(nb, mistake.cell)
    if not cell.metadata["nbgrader"].get("solution"):
        raise LookupError(f"cell {mistake.cell!r} is not an answer cell")
    count = cell.source.count(mistake.old)
    if count != 1:
        raise LookupError(
            f"{mistake.old!r} occurs {count} times in cell {mistake.cell!r}, not once: the "
            "lab's solution changed; update this mistake to match it."
        )
    cell.source = cell.source.replace(mistake.old, mistake.new)
    return nb


def hand_in(folder: Path, student_id: str, nb: NotebookNode) -> Path:
    """Write `nb` as `student_id`'s submission: folder/<student_id>/<lab>.ipynb."""
    path = Path(folder) / student_id / NOTEBOOK
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def hidden_test_lines(nb: NotebookNode | None = None) -> list[str]:
    """The stripped, non-empty lines between the hidden-test delimiters of the solution."""
    nb = nb if nb is not None else solution()
    lines = []
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if BEGIN_HIDDEN in line:
                inside = True
            elif END_HIDDEN in line:
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


def page_text(page: str) -> str:
    """An HTML page as a reader sees it: tags gone, entities decoded, so that a hidden line
    split into syntax-highlighting spans is still found whole."""
    without_code = re.sub(r"(?is)<(script|style)\b.*?</\1>", "", page)
    return html.unescape(re.sub(r"<[^>]+>", "", without_code))
