"""How a test cell's outputs become points: nbgrader's rule, minus "stderr means failure".

nbgrader gives a test cell zero when it raised, and also when it wrote anything to stderr.
In this course stderr carries noise that says nothing about correctness: Numba's
NumbaPerformanceWarning ("Grid size 1 will likely result in GPU under-utilization") on a real
GPU, tqdm progress bars, torch.distributed's log lines. A correct kernel must not lose its
points to a warning, so here a test cell fails only when it raises (an `error` output,
timeouts included). Partial credit (a test cell whose value is a number) works as in nbgrader.
"""

from __future__ import annotations

from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import SaveAutoGrades


def auto_score(cell: NotebookNode, log=None) -> tuple[float | None, float]:
    """(points earned or None when a person must grade it, points possible) for a grade cell."""
    if utils.is_solution(cell) or cell.cell_type != "code":
        return utils.determine_grade(cell, log)  # manual and unchanged-answer rules: nbgrader's
    max_points = float(cell.metadata["nbgrader"]["points"])
    if any(output.output_type == "error" for output in cell.outputs):
        return 0.0, max_points
    for output in cell.outputs:
        if output.output_type == "execute_result":
            return utils.get_partial_grade(output, max_points, log), max_points
    return max_points, max_points


class SaveAutoGradesOnRaise(SaveAutoGrades):
    """nbgrader's SaveAutoGrades with `auto_score` as the rule; everything else unchanged."""

    def _add_score(self, cell, resources):
        grade = self.gradebook.find_grade(
            cell.metadata["nbgrader"]["grade_id"],
            self.notebook_id,
            self.assignment_id,
            self.student_id,
        )
        grade.auto_score, _ = auto_score(cell, self.log)
        # As in nbgrader: a manual score given earlier, or no automatic one, needs a person.
        grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        self.gradebook.db.commit()
