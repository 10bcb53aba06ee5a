"""Lab 1 submissions made from the lab's own notebooks, for grading it end to end.

    solution()                       the source notebook, answers and hidden tests included
    released()                       labs/lab1_cuda_kernels as a learner receives it
    with_mistake(MISTAKES[0])        the solution with one part broken the way learners break it
    hand_in(folder, "ada", nb)       folder/ada/lab1_cuda_kernels.ipynb, as a learner hands it in

Built on tests/lab_submissions.py (a mistake is a string replacement that must be found
exactly once, so a change to the lab's solution fails loudly here).
Not a test module (no `test_` prefix): the Lab 1 grading tests and benchmarks import it.
"""

from __future__ import annotations

from lab_submissions import (  # noqa: F401 - re-exported for the Lab 1 tests
    ROOT,
    Lab,
    Mistake,
    cell_by_grade_id,
    grade_id,
    page_text,
    points_of,
    read,
)

LAB = "lab1_cuda_kernels"
LAB1 = Lab(LAB)
NOTEBOOK = LAB1.notebook
SOLUTION = LAB1.solution_path
RELEASE = LAB1.release_path

# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_saxpy": 2,
    "test_transpose": 2,
    "test_block_sum": 3,
    "test_matmul_tiled": 4,
    "test_histogram": 3,
    "test_waves": 2,
}


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


solution = LAB1.solution
released = LAB1.released
with_mistake = LAB1.with_mistake
hand_in = LAB1.hand_in
hidden_test_lines = LAB1.hidden_test_lines
