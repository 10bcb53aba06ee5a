"""The capstone graded end to end: the checks of tests/grading_checks.py on its batch, and its
written answer, which a person grades."""

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_specs import CAPSTONE
from lab_submissions import cell_by_grade_id

SPEC = CAPSTONE
pytestmark = list(SPEC.marks)


def test_the_capstone_release_holds_no_rubric_and_asks_for_an_answer():
    (written, _), = CAPSTONE.assignment.manual
    released = cell_by_grade_id(CAPSTONE.lab.released(), written)
    solution = cell_by_grade_id(CAPSTONE.lab.solution(), written)
    assert solution.cell_type == "markdown"
    assert "Rubric" in solution.source and "Rubric" not in released.source
    assert "YOUR ANSWER HERE" in released.source
